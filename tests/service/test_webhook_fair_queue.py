"""The webhook queue is a fair queue by tenant: a result notification is published with its tenant as message group,
which SNS forwards to the SQS standard queues subscribed (fair queues on AWS: one tenant's backlog of webhook events
does not hold another tenant's back); against a real moto server over HTTP."""

from __future__ import annotations

import datetime as dt

import pytest

from async_inference.aws import Notifier, client
from async_inference.jobs import JobStatus
from async_inference.schemas import ResultNotification, Timings
from local_runtime.moto_server import MotoServer, free_port


def note(job: str, tenant: str) -> ResultNotification:
    now = dt.datetime.now(dt.UTC)
    return ResultNotification(
        job_id=f"job_{job * 32}", tenant=tenant, status=JobStatus.SUCCEEDED, timings=Timings(created_at=now)
    )


@pytest.mark.parametrize("batched", [False, True], ids=["publish", "publish_batch"])
def test_a_notification_reaches_the_subscribed_queue_with_its_tenant_as_message_group(moto: MotoServer, batched: bool):
    # GIVEN a topic with a standard queue subscribed, raw, as the webhook queue is
    topic = client("sns").create_topic(Name=f"results-{free_port()}")["TopicArn"]
    queue = client("sqs").create_queue(QueueName=f"webhooks-{free_port()}")["QueueUrl"]
    arn = client("sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    notifier = Notifier(topic)
    # WHEN tenant A's and tenant B's notifications are published
    if batched:
        notifier.publish_batch([(note("a", "tenant-a"), True), (note("b", "tenant-b"), True)])
    else:
        notifier.publish(note("a", "tenant-a"), has_webhook=True)
        notifier.publish(note("b", "tenant-b"), has_webhook=True)
    # THEN each reaches the queue in its tenant's message group
    received = client("sqs").receive_message(
        QueueUrl=queue, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"]
    )["Messages"]
    groups = {
        ResultNotification.model_validate_json(m["Body"]).tenant: m["Attributes"].get("MessageGroupId")
        for m in received
    }
    assert groups == {"tenant-a": "tenant-a", "tenant-b": "tenant-b"}
