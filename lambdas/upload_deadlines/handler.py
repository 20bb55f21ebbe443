"""Upload deadlines: a job still awaiting its upload when its presign window and grace are over ends `expired`.

Each message is one job's deadline, delayed by the API to the end of the job's presign window. A deadline that comes
before the grace is over is hidden until it is (ChangeMessageVisibility) and reported as a batch item failure, so SQS
delivers it again then; one that keeps failing moves to the queue's DLQ after
``settings.UPLOAD_DEADLINE_MAX_RECEIVE_COUNT`` receives. The event source mapping must have ``ReportBatchItemFailures``
on, or one early deadline would redeliver the whole batch.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.aws import UploadDeadlines
from async_inference.config import ENV_UPLOAD_DEADLINES_QUEUE_URL, ServiceSettings
from async_inference.jobs_service import JobService

logger = Logger()
tracer = Tracer()
# The first delivery of every deadline comes at the window's end, before the grace is over: a batch whose records are
# all handed back is the ordinary case, not a failed invocation.
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
config = ServiceSettings.load()
if not config.upload_deadlines_queue_url:
    raise RuntimeError(f"{ENV_UPLOAD_DEADLINES_QUEUE_URL} is not set: this function consumes that queue")
watch = JobService.from_config(config.service, allow_local_webhooks=config.allow_local_webhooks).deadlines
deadlines = UploadDeadlines(config.upload_deadlines_queue_url)


class NotYet(Exception):
    """Marks the record as a batch item failure; its message was hidden until the grace is over."""


@tracer.capture_method(capture_response=False)
def record_handler(record: SQSRecord) -> None:
    check = watch.check(record.body)
    if check.retry_in_s:
        deadlines.hide(record.receipt_handle, check.retry_in_s)
        raise NotYet(f"job {check.job.job_id if check.job else None}: grace over in {check.retry_in_s} s")
    job = check.job
    logger.info(
        "upload deadline checked",
        extra={"job_id": job.job_id if job else None, "status": job.status.value if job else None},
    )


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
