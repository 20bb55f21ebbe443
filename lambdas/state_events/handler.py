"""Job and batch notifications (the result topic, the job event topic) as EventBridge events
(async_inference.state_events)."""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import SNSEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.aws import client
from async_inference.config import ENV_EVENT_BUS_NAME
from async_inference.state_events import entry_of, put_all

logger = Logger()
tracer = Tracer()
bus = os.environ.get(ENV_EVENT_BUS_NAME, "default")
events = client("events")


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=SNSEvent)
def lambda_handler(event: SNSEvent, context: LambdaContext) -> dict[str, Any]:
    entries = []
    for record in event.records:
        message = record.sns
        attributes = {name: attribute.value for name, attribute in message.message_attributes.items()}
        entry = entry_of(message.message, attributes, bus)
        if entry is not None:
            entries.append(entry)
    failed = put_all(events, entries)
    if failed:
        raise RuntimeError(f"EventBridge refused {failed} of {len(entries)} events; SNS retries the invocation")
    logger.info("events put", extra={"events": len(entries)})
    return {"put": len(entries)}
