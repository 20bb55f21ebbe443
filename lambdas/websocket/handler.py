"""The WebSocket API's routes: ``$connect`` (a tenant's API key, or the connection is refused), ``$disconnect``,
``subscribe`` and ``$default``, as a thin adapter from API Gateway's WebSocket events to ``async_inference.push``.

``$connect`` answers 403 for a missing or unknown key: API Gateway then refuses the handshake with that status. The
subscribe and default routes have route responses, so the ``body`` returned is what the client receives.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.authorizer import TenantKeys
from async_inference.aws import ApiKeyValues, ConnectionStore, TooManyConnections
from async_inference.config import WebSocketSettings
from async_inference.push import WebSocketRoutes
from async_inference.streaming import EventLog

logger = Logger()
tracer = Tracer()
config = WebSocketSettings.load()
# The same key lookup as the REST API's authorizer: this stack's tenant keys, read by id, cached.
routes = WebSocketRoutes(
    ConnectionStore(config.connections_table_name),
    TenantKeys(config.tenant_api_key_ids, ApiKeyValues()),
    # A subscription with starting_after is answered with the job's deltas since, read from its event log.
    EventLog(config.stream_table_name) if config.stream_table_name else None,
)


def _answer(status: int, body: str | None = None) -> dict[str, Any]:
    return {"statusCode": status, **({"body": body} if body is not None else {})}


@tracer.capture_method(capture_response=False)
def route(event: APIGatewayProxyEvent) -> dict[str, Any]:
    context = event.request_context
    connection_id, route_key = context.connection_id or "", context.route_key
    logger.append_keys(connection_id=connection_id, route=route_key)
    if route_key == "$connect":
        try:
            tenant = routes.connect(connection_id, event.headers, event.query_string_parameters)
        except TooManyConnections as exc:
            logger.info("connection refused: %s", exc)
            return _answer(429)
        if tenant is None:
            logger.info("connection refused: no known API key")
            return _answer(403)
        logger.info("connected", extra={"tenant": tenant})
        return _answer(200)
    if route_key == "$disconnect":
        routes.disconnect(connection_id)
        return _answer(200)
    if route_key == settings.WS_ROUTE_SUBSCRIBE:
        return _answer(200, routes.subscribe(connection_id, event.body))
    return _answer(200, routes.default(event.body))


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=APIGatewayProxyEvent)
def lambda_handler(event: APIGatewayProxyEvent, context: LambdaContext) -> dict[str, Any]:
    return route(event)
