"""Small adapters over the AWS services the job pipeline uses, one module per service or concern:

- ``clients``: the shared boto3 settings, ``client`` and ``is_error``;
- ``dynamodb``: the job table (``JobStore``) and the conditional writes the batch table shares;
- ``s3``: the claim-check bucket (``Blobs``);
- ``sqs``: the claim-check, batch control, upload-deadline and webhook queues;
- ``sns``: the result topic (``Notifier``) and the job event topic (``JobEvents``);
- ``capacity``: the GPU workers' ECS service and Auto Scaling group, as the wake from zero sees them;
- ``apigateway``: API keys and their tenants;
- ``websocket``: the WebSocket API's connection table and management API.

This package re-exports every adapter, so callers import them from ``async_inference.aws``.

boto3 is called from adapter modules only: this package's, the batches' (``async_inference/batches/aws.py``,
``async_inference/batches/store.py``), the worker's model download (``gpu_worker/model_source.py``) and the
operator's account checks before a first deploy (``async_inference/preflight.py``);
``tests/unit/test_aws_adapters.py`` checks that no other module of the service imports it.

Each adapter takes its boto3 client or resource in the constructor so a process builds its clients once (module level
in a Lambda, once per worker) and tests can hand in clients pointed at a moto server. ``AWS_ENDPOINT_URL``, which
boto3 honours by itself, is how the local runtime points everything at moto.
"""

from __future__ import annotations

from async_inference.aws.apigateway import ApiKeyValues, TenantDirectory
from async_inference.aws.capacity import WAKE_HOLD_RELEASE, CapacityGroup, WorkerService
from async_inference.aws.clients import BOTO_CONFIG, MAX_CONCURRENT_REQUESTS, client, is_error
from async_inference.aws.dynamodb import JobStore, append_webhook_attempt, put_new
from async_inference.aws.s3 import Blobs, PayloadTooLarge
from async_inference.aws.sns import (
    SNS_BATCH_BYTES,
    SNS_BATCH_ENTRIES,
    JobEvents,
    Notifier,
    activity_attributes,
    notification_attributes,
)
from async_inference.aws.sqs import (
    SQS_MAX_DELAY_S,
    ControlQueue,
    JobQueue,
    QueueMessage,
    UploadDeadlines,
    WebhookQueues,
)
from async_inference.aws.websocket import ConnectionPoster, ConnectionStore, TooManyConnections, TooManySubscriptions

__all__ = [
    "BOTO_CONFIG",
    "MAX_CONCURRENT_REQUESTS",
    "SNS_BATCH_BYTES",
    "SNS_BATCH_ENTRIES",
    "SQS_MAX_DELAY_S",
    "WAKE_HOLD_RELEASE",
    "ApiKeyValues",
    "Blobs",
    "CapacityGroup",
    "ConnectionPoster",
    "ConnectionStore",
    "ControlQueue",
    "JobEvents",
    "JobQueue",
    "JobStore",
    "Notifier",
    "PayloadTooLarge",
    "QueueMessage",
    "TenantDirectory",
    "TooManyConnections",
    "TooManySubscriptions",
    "UploadDeadlines",
    "WebhookQueues",
    "WorkerService",
    "activity_attributes",
    "append_webhook_attempt",
    "client",
    "is_error",
    "notification_attributes",
    "put_new",
]
