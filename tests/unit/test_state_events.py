"""EventBridge entries for notifications (async_inference.state_events)."""

from __future__ import annotations

import json

from async_inference.state_events import DETAIL_TYPES, SOURCE, entry_of, put_all


def test_a_jobs_final_notification_becomes_its_state_event_without_the_inline_result():
    # GIVEN a succeeded job's notification carrying its result inline WHEN made an entry
    body = json.dumps({"job_id": "j1", "tenant": "t", "status": "succeeded", "result": {"choices": []}})
    entry = entry_of(body, {"event": "job.completed"}, "default")
    # THEN it is a "Job Succeeded" event of the service's source on the bus, the result left out
    assert (entry["Source"], entry["DetailType"], entry["EventBusName"]) == (SOURCE, "Job Succeeded", "default")
    assert json.loads(entry["Detail"]) == {"job_id": "j1", "tenant": "t", "status": "succeeded"}


def test_a_batchs_end_and_a_jobs_start_are_events_and_progress_is_not():
    # GIVEN a batch's end, a job's start and a job's progress WHEN made entries
    batch = json.dumps(
        {"type": "batch.completed", "data": {"id": "batch_1"}, "tenant": "t", "batch": {"id": "batch_1"}}
    )
    started = json.dumps({"event": "job.started", "job_id": "j1", "tenant": "t"})
    # THEN the first two are their state's events, progress none, and anything unknown none
    assert entry_of(batch, {"event": "batch.completed"}, "b")["DetailType"] == "Batch Completed"
    assert json.loads(entry_of(batch, {"event": "batch.completed"}, "b")["Detail"])["id"] == "batch_1"
    assert entry_of(started, {"event": "job.started"}, "b")["DetailType"] == "Job Started"
    assert entry_of(started, {"event": "job.progress"}, "b") is None
    assert entry_of("not json", {"event": "job.completed"}, "b") is None
    assert len(set(DETAIL_TYPES.values())) == len(DETAIL_TYPES)


def test_entries_are_put_ten_a_call_and_failures_counted():
    # GIVEN 23 entries and an EventBridge that fails one entry of each call
    calls = []

    class Events:
        def put_events(self, Entries):  # noqa: N803
            calls.append(len(Entries))
            return {"FailedEntryCount": 1}

    # WHEN put THEN three calls of 10, 10 and 3, and three failures reported
    assert put_all(Events(), [{}] * 23) == 3 and calls == [10, 10, 3]
