"""S3 "object created" events under the inbox rules' prefixes: each object becomes a job or a batch
(async_inference.inbox)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import S3Event, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import TypeAdapter

from async_inference.batches.service import BatchService
from async_inference.config import ENV_INBOX_RULES, ServiceSettings, SettingsError
from async_inference.inbox import InboxIntake, InboxRule
from async_inference.jobs_service import JobService

logger = Logger()
tracer = Tracer()
config = ServiceSettings.load()
if not os.environ.get(ENV_INBOX_RULES):
    raise SettingsError(f"{ENV_INBOX_RULES} is not set (the inbox rules, a JSON list)")
intake = InboxIntake(
    rules=TypeAdapter(list[InboxRule]).validate_json(os.environ[ENV_INBOX_RULES]),
    jobs=JobService.from_config(
        config.service,
        allow_local_webhooks=config.allow_local_webhooks,
        served_models=config.served_models,
        quotas=config.tenant_quotas,
        limits=config.request_limits,
    ).api,
    batches=BatchService.from_settings(config),
)


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=S3Event)
def lambda_handler(event: S3Event, context: LambdaContext) -> dict[str, Any]:
    taken = []
    for record in event.records:
        # S3 event keys are URL-encoded (spaces become '+').
        obj = record.s3.get_object
        accepted = intake.accept(unquote_plus(obj.key), obj.size, obj.etag or "")
        taken.append(accepted.job_id or accepted.batch_id)
    return {"processed": len(taken), "taken_in": len([t for t in taken if t])}
