"""The job queue adapter's side of fair scheduling (gpu_worker.fairness), against a real moto server over HTTP: a
claim check goes out with its tenant as message group (what SQS fair queues tell tenants apart by), and a requeued
message is a new message at the tail, its receive count started over, the received copy gone."""

from __future__ import annotations

import datetime as dt

from async_inference.aws import JobQueue, client
from async_inference.schemas import ClaimCheck
from local_runtime.moto_server import MotoServer, free_port

DEADLINE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def claim(job: str, tenant: str) -> ClaimCheck:
    return ClaimCheck(job_id=f"job_{job * 32}", tenant=tenant, bucket="b", key="k", deadline=DEADLINE, timeout_s=60)


def test_a_requeued_claim_check_goes_behind_the_others_as_a_new_message_of_its_tenant(moto: MotoServer):
    sqs = client("sqs")
    queue = JobQueue(sqs.create_queue(QueueName=f"jobs-{free_port()}")["QueueUrl"])
    # GIVEN tenant A's claim check queued before tenant B's
    queue.send(claim("a", "tenant-a"))
    queue.send(claim("b", "tenant-b"))
    [first] = queue.receive(max_messages=1, wait_s=0, visibility_timeout_s=30)
    assert '"tenant":"tenant-a"' in first.body and first.receive_count == 1
    # WHEN A's is requeued
    assert queue.requeue([(first, "tenant-a")]) == []
    # THEN B's comes first, then A's again: the same body, a new message, received once, with A as its message group
    received = sqs.receive_message(
        QueueUrl=queue.url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=30,
        MessageSystemAttributeNames=["ApproximateReceiveCount", "MessageGroupId"],
    )["Messages"]
    assert [m["Body"] for m in received] == [claim("b", "tenant-b").model_dump_json(exclude_none=True), first.body]
    again = received[1]
    assert again["MessageId"] != first.message_id
    assert again["Attributes"]["ApproximateReceiveCount"] == "1"
    assert [m["Attributes"].get("MessageGroupId") for m in received] == ["tenant-b", "tenant-a"]
    # AND the received copy is gone: nothing else is in the queue
    attributes = sqs.get_queue_attributes(QueueUrl=queue.url, AttributeNames=["All"])["Attributes"]
    visible, hidden = attributes["ApproximateNumberOfMessages"], attributes["ApproximateNumberOfMessagesNotVisible"]
    assert (visible, hidden) == ("0", "2")
