"""The delta push function: the job event log's stream hands it the segments the workers write while streamed jobs
decode, and each is posted as a ``job.delta`` to the job's tenant's WebSocket connections that follow the job, in the
log's order; gone connections are forgotten.

Its event source mapping's filter lets through only written segments that carry their job's tenant (not the TTL's
deletions). A post that fails for another reason than a closed connection is logged and not retried (a retry of the
batch would tell the others twice); a client that misses a delta sees the gap in ``seq`` and resumes after the last
it has (``"starting_after"`` in its subscription).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import DynamoDBStreamEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.config import PushSettings
from async_inference.push import Pusher, delta_of

logger = Logger()
tracer = Tracer()
config = PushSettings.load()
pusher = Pusher.from_settings(config)


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=DynamoDBStreamEvent)
def lambda_handler(event: DynamoDBStreamEvent, context: LambdaContext) -> dict[str, Any]:
    pushed = []
    for record in event.records:
        delta = delta_of(record.dynamodb.new_image) if record.dynamodb else None
        if delta is None:
            logger.warning("not a job's segment", extra={"event_id": record.event_id})
            continue
        pushed.append(delta)
    outcome = pusher.push_all(pushed)
    logger.info("pushed", extra={"segments": len(pushed), **vars(outcome)})
    return vars(outcome)
