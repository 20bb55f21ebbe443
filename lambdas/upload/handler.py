"""S3 "object created" events for presigned uploads: check the object and queue its job, or fail it with a reason;
for a Files API upload, delete the object when its file was deleted before it arrived."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import S3Event, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.batches.service import BatchService
from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService

logger = Logger()
tracer = Tracer()
config = ServiceSettings.load()
uploads = JobService.from_config(
    config.service,
    allow_local_webhooks=config.allow_local_webhooks,
    served_models=config.served_models,
    quotas=config.tenant_quotas,  # read for each tenant's bounds on a request's cost (no submit happens here)
    limits=config.request_limits,
).uploads


# Files API uploads (settings.file_upload_key); None where the stack has no batches.
files = BatchService.from_settings(config)


@tracer.capture_method(capture_response=False)
def accept(key: str, size: int) -> None:
    if settings.parse_file_upload_key(key) is not None:
        if files is not None and files.uploaded(key) is None:
            logger.warning("file upload matches no file: deleted", extra={"key": key})
        return
    job = uploads.accept_upload(key, size)
    if job is None:
        logger.warning("object under the upload prefix matches no waiting job", extra={"key": key})
    else:
        logger.info("upload checked", extra={"job_id": job.job_id, "status": job.status.value, "error": job.error})


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=S3Event)
def lambda_handler(event: S3Event, context: LambdaContext) -> dict[str, Any]:
    for record in event.records:
        # S3 event keys are URL-encoded (spaces become '+').
        accept(unquote_plus(record.s3.get_object.key), record.s3.get_object.size)
    return {"processed": len(list(event.records))}
