"""The local moto server's standard queues are fair queues by message group, as AWS's are
(``local_runtime.moto_main.fair_standard_queues``): a quiet tenant's message is received ahead of a backlog of a
tenant with messages in flight. moto's SQS runs in this process with the local server's replacements applied."""

from __future__ import annotations

import os
from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from local_runtime.moto_main import cheap_sqs_scans, fair_standard_queues


@pytest.fixture
def sqs(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    # mock_aws intercepts AWS's own endpoints only (see test_moto_sqs_cost.py)
    for name in [n for n in os.environ if n.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)
    cheap_sqs_scans(monkeypatch.setattr)
    fair_standard_queues(monkeypatch.setattr)
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def _send(sqs, url: str, tenant: str, count: int) -> None:
    for start in range(0, count, 10):
        entries = [
            {"Id": str(i), "MessageBody": f"{tenant} {start + i}", "MessageGroupId": tenant}
            for i in range(min(10, count - start))
        ]
        sqs.send_message_batch(QueueUrl=url, Entries=entries)


def test_a_quiet_tenants_message_is_received_ahead_of_a_tenants_backlog_with_messages_in_flight(sqs) -> None:
    # GIVEN tenant A with 3 messages in flight and 40 more queued, and then one message of tenant B
    url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
    _send(sqs, url, "tenant-a", 43)
    assert len(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=600)["Messages"]) == 3
    _send(sqs, url, "tenant-b", 1)
    # WHEN a consumer receives
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600)["Messages"]
    # THEN B's message comes first, then A's in the order they were sent
    assert [m["Body"] for m in received] == ["tenant-b 0", *(f"tenant-a {i}" for i in range(3, 12))]


def test_without_messages_in_flight_a_standard_queue_keeps_the_order_they_were_sent_in(sqs) -> None:
    # GIVEN A's messages then B's, none received yet
    url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
    _send(sqs, url, "tenant-a", 3)
    _send(sqs, url, "tenant-b", 1)
    # WHEN a consumer receives THEN they come in the order they were sent
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in received] == ["tenant-a 0", "tenant-a 1", "tenant-a 2", "tenant-b 0"]
