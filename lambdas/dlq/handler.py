"""Claim checks that exhausted their receives: the job becomes `failed` with a reason and is notified.

It consumes the job queue's DLQ and the batch lane's: a job's claim check from either (the lane carries jobs with
priority "batch") fails its job; a chunk claim check has its lines written as error lines and is counted, so its batch
finalizes (``async_inference.batches.dead_letters``).

A message this handler cannot process (not a claim check) is reported as a batch item failure, so it stays in the DLQ
for an operator (`python -m async_inference.cli dlq list`), and is counted in
``settings.METRIC_DEAD_LETTERS_UNPROCESSABLE`` (on the dashboard). It comes back after the DLQ's visibility timeout, and
is counted again, until an operator removes it or the DLQ's retention ends; the DLQ's depth alarm stays on meanwhile.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.aws import Blobs, ControlQueue
from async_inference.batches.dead_letters import ChunkDeadLetters, is_chunk_message
from async_inference.batches.store import BatchStore
from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService, NotAClaimCheck

logger = Logger()
tracer = Tracer()
metrics = Metrics()
# A batch of messages that all stay is an ordinary outcome here, not a failed invocation.
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
config = ServiceSettings.load()
dead_letters = JobService.from_config(config.service, allow_local_webhooks=config.allow_local_webhooks).dead_letters
# None without the batch resources: a chunk is then left in the DLQ, as any message this handler cannot process.
chunks = (
    ChunkDeadLetters(
        store=BatchStore(config.batch_table_name),
        blobs=Blobs(config.bucket_name),
        control=ControlQueue(config.batch_control_queue_url),
    )
    if config.batch_table_name and config.batch_control_queue_url
    else None
)


@tracer.capture_method(capture_response=False)
def record_handler(record: SQSRecord) -> None:
    # The DLQ's own receive count restarts at 1; the attempts that led here are the redrive policy's.
    if is_chunk_message(record.body) and chunks is not None:
        return _chunk(record)
    try:
        job = dead_letters.dead_letter(record.body, settings.MAX_RECEIVE_COUNT)
    except NotAClaimCheck as exc:
        metrics.add_metric(name=settings.METRIC_DEAD_LETTERS_UNPROCESSABLE, unit=MetricUnit.Count, value=1)
        logger.error(
            "a DLQ message that is not a claim check stays in the DLQ",
            extra={"message_id": record.message_id, "reason": str(exc)},
        )
        raise
    logger.info("dead letter handled", extra={"job_id": job.job_id if job else None})


def _chunk(record: SQSRecord) -> None:
    assert chunks is not None
    try:
        ended = chunks.end(record.body, settings.MAX_RECEIVE_COUNT)
    except ValueError as exc:
        metrics.add_metric(name=settings.METRIC_DEAD_LETTERS_UNPROCESSABLE, unit=MetricUnit.Count, value=1)
        logger.error(
            "a DLQ message that is not a chunk claim check stays in the DLQ",
            extra={"message_id": record.message_id, "reason": str(exc)},
        )
        raise
    logger.info(
        "dead-lettered chunk handled",
        extra={"counted": ended.counted, "failed_lines": ended.failed, "finalize_sent": ended.finalize_sent},
    )


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
