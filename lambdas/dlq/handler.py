"""Claim checks that exhausted their receives: the job becomes `failed` with a reason and is notified.

A message this handler cannot process is reported as a batch item failure and stays in the DLQ for an operator
(`cli dlq list` / `cli dlq redrive`).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.config import ServiceSettings
from async_inference.service import JobService

logger = Logger()
tracer = Tracer()
processor = BatchProcessor(event_type=EventType.SQS)
config = ServiceSettings.load()
service = JobService.from_config(config.service, allow_local_webhooks=config.allow_local_webhooks)


@tracer.capture_method
def record_handler(record: SQSRecord) -> None:
    # The DLQ's own receive count restarts at 1; the attempts that led here are the redrive policy's.
    job = service.dead_letter(record.body, settings.MAX_RECEIVE_COUNT)
    logger.info("dead letter handled", extra={"job_id": job.job_id if job else None})


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
