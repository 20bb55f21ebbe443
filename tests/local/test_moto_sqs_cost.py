"""The local moto server's SQS costs per message do not grow with a queue's depth (``local_runtime.moto_main``).

moto rebuilt a queue's whole attribute summary, three passes over every message it holds, for each message it
received and sent; a deep queue (a function's event queue that fell behind in the soak) made every request slower.
These run moto's SQS in this process with the local server's replacements applied, and count the summaries built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.sqs.models import Queue

from local_runtime.moto_main import cheap_sqs_scans

IN_FLIGHT, VISIBLE, DELAYED = 500, 10, 3


@pytest.fixture
def summaries(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """moto's SQS in this process, as the local server runs it; yields a counter of queue attribute summaries built."""
    # mock_aws intercepts AWS's own endpoints only: an endpoint an earlier test's local stack left in the environment
    # would send these requests to that stack's moto server instead of this process's
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    cheap_sqs_scans(monkeypatch.setattr)
    built = [0]
    summary = Queue.attributes.fget

    def counted(self: Queue) -> dict[str, Any]:
        built[0] += 1
        return summary(self)

    monkeypatch.setattr(Queue, "attributes", property(counted))
    with mock_aws():
        yield built


def test_receiving_from_a_deep_queue_builds_no_summary_per_message(summaries: list[int]) -> None:
    # GIVEN a queue holding 500 messages in flight, 10 visible and 3 delayed
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="deep")["QueueUrl"]
    for _ in range((IN_FLIGHT + VISIBLE) // 10):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(10)])
    for _ in range(IN_FLIGHT // 10):
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)
    for _ in range(DELAYED):
        sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=600)
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]

    # WHEN 10 messages are received and 10 sent
    summaries[0] = 0
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    for _ in range(10):
        sqs.send_message(QueueUrl=url, MessageBody="more")

    # THEN the queue's summary was built at most once per request, not once per message (moto's own: 3 per message
    # received), and the counts it reports are what the queue holds
    assert len(received) == VISIBLE
    assert 1 <= summaries[0] <= 10  # at least once: the requests reached this process's moto
    assert (
        int(counts["ApproximateNumberOfMessagesNotVisible"]),
        int(counts["ApproximateNumberOfMessages"]),
        int(counts["ApproximateNumberOfMessagesDelayed"]),
    ) == (IN_FLIGHT, VISIBLE, DELAYED)


def test_a_message_past_its_retention_period_is_not_received(summaries: list[int]) -> None:
    # GIVEN a queue that keeps messages 60 s, and a message sent two minutes ago
    sqs = boto3.client("sqs", region_name="us-east-1")
    url = sqs.create_queue(QueueName="short", Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="new")
    sqs.send_message(QueueUrl=url, MessageBody="old")
    from moto.sqs.models import sqs_backends

    # whichever account moto filed it under (an earlier test's environment may have set another than moto's default)
    (queue,) = [
        backend["us-east-1"].queues["short"]
        for backend in sqs_backends.values()
        if "short" in backend["us-east-1"].queues
    ]
    old = next(m for m in queue._messages if m.body == "old")
    old.sent_timestamp -= 120_000

    # WHEN both are asked for
    bodies = [m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]]

    # THEN only the one within its retention period comes back
    assert bodies == ["new"]
