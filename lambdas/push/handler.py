"""The push function: each job event from the result topic (final states) and the job event topic (started,
progress) is posted to the tenant's WebSocket connections that subscribed to its job, and each batch's end (the result
topic's batch.* events) to those that follow the batch; gone connections are forgotten.

Its subscriptions filter on the ``event`` message attribute, so only job events reach it. A post that fails for
another reason than a closed connection is logged and not retried (a retry of the invocation would tell the others
twice); the client reads the job at its next check.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import SNSEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.config import PushSettings
from async_inference.push import Pusher, event_of

logger = Logger()
tracer = Tracer()
config = PushSettings.load()
pusher = Pusher.from_settings(config)


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=SNSEvent)
def lambda_handler(event: SNSEvent, context: LambdaContext) -> dict[str, Any]:
    told = {"sent": 0, "gone": 0, "failed": 0, "revoked": 0}
    for record in event.records:
        message = record.sns
        attributes = {name: attribute.value for name, attribute in message.message_attributes.items()}
        pushed = event_of(message.message, attributes)
        if pushed is None:
            logger.warning("not a job event", extra={"attributes": attributes})
            continue
        outcome = pusher.push(pushed)
        told = {key: told[key] + getattr(outcome, key) for key in told}
        logger.info(
            "pushed", extra={**pushed.event.model_dump(include={"job_id", "batch_id", "type"}), **vars(outcome)}
        )
    return told
