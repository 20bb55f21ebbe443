"""S3 "object created" events under the event rules' prefixes: each object becomes a job or a batch
(async_inference.events_in)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote_plus

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import S3Event, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import TypeAdapter

from async_inference.batches.service import BatchService
from async_inference.config import ENV_EVENT_RULES, ServiceSettings, SettingsError
from async_inference.events_in import EventIntake, EventRule
from async_inference.jobs_service import JobService

logger = Logger()
tracer = Tracer()
config = ServiceSettings.load()
if not os.environ.get(ENV_EVENT_RULES):
    raise SettingsError(f"{ENV_EVENT_RULES} is not set (the event rules, a JSON list)")
intake = EventIntake(
    rules=TypeAdapter(list[EventRule]).validate_json(os.environ[ENV_EVENT_RULES]),
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
