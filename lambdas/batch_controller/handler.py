"""The batch controller: BatchControl messages from the control queue, each a plan or a finalize step of a batch
(``async_inference.batches.controller``). A step that fails on an infrastructure fault is reported as a batch item
failure and comes back; a message that is not a BatchControl is logged and dropped (it can never succeed)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from async_inference.batches.controller import BatchController
from async_inference.config import ServiceSettings
from async_inference.schemas import BatchControl

logger = Logger()
tracer = Tracer()
processor = BatchProcessor(event_type=EventType.SQS)
controller = BatchController.from_settings(ServiceSettings.load())


@tracer.capture_method(capture_response=False)
def record_handler(record: SQSRecord) -> None:
    try:
        control = BatchControl.model_validate_json(record.body)
    except ValidationError:
        logger.error("not a BatchControl message; dropped", extra={"body": record.body[:200]})
        return
    logger.append_keys(batch_id=control.batch_id, step=control.kind)
    batch = controller.handle(control)
    logger.info("batch step done", extra={"status": batch.status.value if batch else None})


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
