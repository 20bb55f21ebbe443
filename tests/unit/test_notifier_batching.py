"""PublishBatch requests stay within SNS's limits: 10 entries and 256 KB each."""

from __future__ import annotations

import datetime as dt

from async_inference.aws import SNS_BATCH_BYTES, SNS_BATCH_ENTRIES, Notifier
from async_inference.jobs import JobStatus
from async_inference.schemas import ResultNotification, Timings


class StubSns:
    def __init__(self, fail_ids: set[str] = frozenset()) -> None:
        self.calls: list[list[dict]] = []
        self._fail = fail_ids

    def publish_batch(self, TopicArn: str, PublishBatchRequestEntries: list[dict]) -> dict:
        self.calls.append(PublishBatchRequestEntries)
        ok = [{"Id": e["Id"]} for e in PublishBatchRequestEntries if e["Id"] not in self._fail]
        failed = [{"Id": e["Id"]} for e in PublishBatchRequestEntries if e["Id"] in self._fail]
        return {"Successful": ok, "Failed": failed}


def note(i: int, metadata_chars: int = 0) -> ResultNotification:
    now = dt.datetime.now(dt.UTC)
    return ResultNotification(
        job_id=f"job_{i:032x}",
        tenant="t",
        status=JobStatus.SUCCEEDED,
        metadata={"pad": "x" * metadata_chars},
        timings=Timings(created_at=now),
    )


def test_25_small_notifications_take_3_requests_of_at_most_10():
    sns = StubSns()
    published = Notifier("arn:topic", sns).publish_batch([(note(i), False) for i in range(25)])
    assert published == [True] * 25
    assert [len(c) for c in sns.calls] == [10, 10, 5]


def test_large_notifications_are_split_by_size():
    sns = StubSns()
    big = [(note(i, metadata_chars=100_000), False) for i in range(5)]
    Notifier("arn:topic", sns).publish_batch(big)
    assert all(sum(len(e["Message"]) for e in call) <= SNS_BATCH_BYTES for call in sns.calls)
    assert sum(len(c) for c in sns.calls) == 5 and len(sns.calls) >= 3
    assert all(len(c) <= SNS_BATCH_ENTRIES for c in sns.calls)


def test_each_entry_reports_its_own_outcome_and_carries_the_filter_attributes():
    sns = StubSns(fail_ids={"1"})
    published = Notifier("arn:topic", sns).publish_batch([(note(0), True), (note(1), False), (note(2), False)])
    assert published == [True, False, True]
    attributes = sns.calls[0][0]["MessageAttributes"]
    assert attributes["webhook"]["StringValue"] == "true" and attributes["status"]["StringValue"] == "succeeded"
