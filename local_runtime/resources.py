"""Creates the service's resources on the local endpoint from the same settings the CDK stack uses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from async_inference import settings, webhooks
from async_inference.aws import client
from async_inference.config import ServiceConfig


# Local names of the webhook dispatcher's queues (in AWS, CloudFormation names them).
WEBHOOK_QUEUE_NAME = "inference-webhooks"
WEBHOOK_DLQ_NAME = "inference-webhooks-dlq"


@dataclass(frozen=True)
class LocalResources:
    config: ServiceConfig
    upload_events_queue_url: str
    api_keys: dict[str, str]  # key value -> tenant
    webhook_queue_url: str = ""
    webhook_dlq_url: str = ""


def create_resources(api_keys: dict[str, str]) -> LocalResources:
    s3, sqs, sns, dynamodb, apigateway = (client(s) for s in ("s3", "sqs", "sns", "dynamodb", "apigateway"))

    dlq_url = sqs.create_queue(
        QueueName=settings.DLQ_NAME,
        Attributes={"MessageRetentionPeriod": str(settings.DLQ_RETENTION_DAYS * 86400)},
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue_url = sqs.create_queue(
        QueueName=settings.QUEUE_NAME,
        Attributes={
            "VisibilityTimeout": str(settings.VISIBILITY_TIMEOUT_S),
            "ReceiveMessageWaitTimeSeconds": str(settings.RECEIVE_WAIT_TIME_S),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": settings.MAX_RECEIVE_COUNT}),
        },
    )["QueueUrl"]

    # moto delivers S3 notifications to SQS but cannot invoke a Python function: locally the upload handler reads
    # its S3 events from this queue (in AWS, S3 invokes the Lambda directly).
    upload_events_url = sqs.create_queue(QueueName=settings.UPLOAD_EVENTS_QUEUE_NAME)["QueueUrl"]
    upload_events_arn = sqs.get_queue_attributes(QueueUrl=upload_events_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    s3.create_bucket(Bucket=settings.BUCKET_NAME)
    s3.put_bucket_notification_configuration(
        Bucket=settings.BUCKET_NAME,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": upload_events_arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": settings.UPLOAD_PREFIX}]}},
                }
            ]
        },
    )

    dynamodb.create_table(
        TableName=settings.TABLE_NAME,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": settings.TABLE_PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": settings.TENANT_INDEX_PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": settings.TENANT_INDEX_SORT_KEY, "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": settings.TENANT_INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": settings.TENANT_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": settings.TENANT_INDEX_SORT_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    topic_arn = sns.create_topic(Name=settings.RESULT_TOPIC_NAME)["TopicArn"]
    webhook_queue_url, webhook_dlq_url = _create_webhook_queues(sqs, sns, topic_arn)

    for key, tenant in api_keys.items():
        apigateway.create_api_key(name=tenant, value=key, enabled=True)

    config = ServiceConfig(
        table_name=settings.TABLE_NAME,
        bucket_name=settings.BUCKET_NAME,
        queue_url=queue_url,
        topic_arn=topic_arn,
        dlq_url=dlq_url,
    )
    return LocalResources(
        config=config,
        upload_events_queue_url=upload_events_url,
        api_keys=dict(api_keys),
        webhook_queue_url=webhook_queue_url,
        webhook_dlq_url=webhook_dlq_url,
    )


def subscribe_queue(
    topic_arn: str,
    queue_name: str,
    *,
    filter_policy: dict[str, Any] | None = None,
    queue_attributes: dict[str, str] | None = None,
    sqs: Any = None,
    sns: Any = None,
) -> str:
    """Create an SQS queue and subscribe it to ``topic_arn`` with raw delivery, as the service's own subscribers are;
    its URL. Clients default to the local endpoint's."""
    sqs, sns = sqs or client("sqs"), sns or client("sns")
    url = sqs.create_queue(QueueName=queue_name, Attributes=queue_attributes or {})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    attributes = {"RawMessageDelivery": "true"}
    if filter_policy:
        attributes["FilterPolicy"] = json.dumps(filter_policy)
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn, Attributes=attributes)
    return url


def _create_webhook_queues(sqs: Any, sns: Any, topic_arn: str) -> tuple[str, str]:
    """The dispatcher's queue, subscribed to the result topic with raw delivery, and its DLQ."""
    dlq_url = sqs.create_queue(
        QueueName=WEBHOOK_DLQ_NAME, Attributes={"MessageRetentionPeriod": str(settings.DLQ_RETENTION_DAYS * 86400)}
    )["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": settings.WEBHOOK_MAX_RECEIVE_COUNT}
    url = subscribe_queue(
        topic_arn,
        WEBHOOK_QUEUE_NAME,
        filter_policy=settings.WEBHOOK_FILTER_POLICY,
        queue_attributes={
            "VisibilityTimeout": str(webhooks.QUEUE_VISIBILITY_TIMEOUT_S),
            "RedrivePolicy": json.dumps(redrive),
        },
        sqs=sqs,
        sns=sns,
    )
    return url, dlq_url
