"""What the push function tells a subscriber for each message of the result topic and the job event topic."""

from __future__ import annotations

import pytest

from async_inference import settings
from async_inference.jobs import JobStatus
from async_inference.push import api_key_of, event_of
from async_inference.schemas import JobActivity, JobProgress, ResultNotification, Timings, utcnow

JOB_ID = "job_" + "a" * 32


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (JobStatus.SUCCEEDED, "job.completed"),
        (JobStatus.FAILED, "job.failed"),
        (JobStatus.CANCELLED, "job.cancelled"),
        (JobStatus.EXPIRED, "job.expired"),
    ],
)
def test_a_result_notification_is_the_final_event_of_its_status(status, type_):
    note = ResultNotification(
        job_id=JOB_ID,
        tenant="acme",
        status=status,
        error="why" if status != "succeeded" else None,
        timings=Timings(created_at=utcnow()),
    )
    pushed = event_of(note.model_dump_json(), {settings.EVENT_ATTRIBUTE: settings.RESULT_EVENT})
    assert pushed is not None and pushed.tenant == "acme"
    assert (pushed.event.type, pushed.event.job_id, pushed.event.status) == (type_, JOB_ID, status)
    assert pushed.event.error == note.error


def test_a_progress_activity_carries_the_tokens_so_far():
    progress = JobProgress(completion_tokens=42, updated_at=utcnow())
    activity = JobActivity(event="job.progress", job_id=JOB_ID, tenant="acme", progress=progress)
    pushed = event_of(activity.model_dump_json(), {settings.EVENT_ATTRIBUTE: "job.progress"})
    assert pushed is not None and pushed.event.type == "job.progress" and pushed.event.progress == progress
    assert "tenant" not in pushed.event.model_dump(), "the subscriber is told the job, not whose it is"


def test_a_message_without_a_job_event_attribute_is_not_pushed():
    assert event_of('{"event": "file.deleted"}', {settings.EVENT_ATTRIBUTE: "file.deleted"}) is None
    assert event_of("{}", {}) is None


def test_the_key_comes_from_the_header_whatever_its_case_or_else_the_query():
    assert api_key_of({"X-Api-Key": "k1"}, {settings.WS_API_KEY_QUERY_PARAMETER: "k2"}) == "k1"
    assert api_key_of({"Host": "h"}, {settings.WS_API_KEY_QUERY_PARAMETER: "k2"}) == "k2"
    assert api_key_of(None, None) is None
