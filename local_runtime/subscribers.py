"""What a subscriber of the result topic does for itself: a queue of its own, subscribed with raw delivery (as the
service's own subscribers are) and an optional filter policy. Used by the demo, tests and benchmarks."""

from __future__ import annotations

import json
from typing import Any

from async_inference.aws import client


def subscribe_queue(
    topic_arn: str,
    queue_name: str,
    *,
    filter_policy: dict[str, Any] | None = None,
    queue_attributes: dict[str, str] | None = None,
    sqs: Any = None,
    sns: Any = None,
) -> str:
    """Create an SQS queue and subscribe it to ``topic_arn``; its URL. Clients default to the endpoint of the
    environment (``AWS_ENDPOINT_URL``)."""
    sqs, sns = sqs or client("sqs"), sns or client("sns")
    url = sqs.create_queue(QueueName=queue_name, Attributes=queue_attributes or {})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    attributes = {"RawMessageDelivery": "true"}
    if filter_policy:
        attributes["FilterPolicy"] = json.dumps(filter_policy)
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn, Attributes=attributes)
    return url
