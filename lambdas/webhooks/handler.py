"""The webhook dispatcher: one signed POST per event on the webhook queue, retried by SQS redelivery.

The records of a batch are delivered at once (Powertools' AsyncBatchProcessor, each delivery on a thread of its own),
each attempt ended at its deadline in wall time (``async_inference.webhooks.delivery``), and a receiver that held one
to the deadline is not attempted again for a while (``async_inference.webhooks.slow_receivers``): one tenant's slow or
hanging endpoint holds a batch, and the batches behind it, at most one deadline now and then.

A failed delivery hides its message for the backoff of its receive count and is reported as a batch item failure;
SQS redelivers it then, and after ``WEBHOOK_MAX_RECEIVE_COUNT`` receives moves it to the webhook DLQ. The event source
mapping must have ``ReportBatchItemFailures`` on, or a failure would redeliver the whole batch.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType, async_process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.aws import JobStore, WebhookQueues
from async_inference.batches.store import BatchStore
from async_inference.config import DispatcherSettings
from async_inference.webhooks.backoff import Backoff
from async_inference.webhooks.dispatch import Dispatcher
from async_inference.webhooks.secrets import TenantSecrets

logger = Logger()
tracer = Tracer()
# Every record failing is an ordinary outcome here (one receiver down), not a reason to fail the invocation.
processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
# A thread per record of a full batch: every delivery starts at once. The work is I/O (DNS, one POST, DynamoDB).
deliveries = ThreadPoolExecutor(max_workers=settings.WEBHOOK_BATCH_SIZE, thread_name_prefix="webhook")
config = DispatcherSettings.load()
queues = WebhookQueues(config.webhook_queue_urls)
dispatcher = Dispatcher(
    store=JobStore(config.table_name),
    batches=BatchStore(config.batch_table_name) if config.batch_table_name else None,
    secrets=TenantSecrets.from_settings(config),
    allow_local=config.allow_local_webhooks,
    backoff=Backoff.from_settings(config),
)


class DeliveryFailed(Exception):
    """Marks the record as a batch item failure; its message was hidden for the backoff already."""


@tracer.capture_method(capture_response=False)
async def record_handler(record: SQSRecord) -> None:
    await asyncio.get_running_loop().run_in_executor(deliveries, deliver, record)


def deliver(record: SQSRecord) -> None:
    """Dispatch one record's event; DeliveryFailed (after hiding the message for its backoff) when it must retry."""
    receive_count = int(record.attributes.approximate_receive_count or 1)
    outcome = dispatcher.dispatch(record.body, receive_count)
    # The job id goes on this record's lines only (extra), not on the logger: the next record is another job's.
    if outcome.done:
        # Most events are for jobs without a webhook, and every attempt is recorded on its job: debug is enough.
        logger.debug(
            "webhook event done",
            extra={"job_id": outcome.job_id, "reason": outcome.reason, "receive_count": receive_count},
        )
        return
    queues.hide(record.event_source_arn, record.receipt_handle, outcome.retry_in_s)
    logger.warning(
        "webhook delivery failed",
        extra={
            "job_id": outcome.job_id,
            "reason": outcome.reason,
            "receive_count": receive_count,
            "retry_in_s": outcome.retry_in_s,
        },
    )
    raise DeliveryFailed(outcome.reason)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return async_process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
