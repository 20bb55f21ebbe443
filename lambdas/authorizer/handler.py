"""The REST API's REQUEST authorizer: the caller's API key (``Authorization: Bearer`` or ``x-api-key``) to its tenant.

Allowed: the tenant goes to the API function in the authorizer context, and the key back to API Gateway as
``usageIdentifierKey`` (the API's key source is AUTHORIZER), so the tenant's usage plan still throttles and counts its
requests. Refused (no key, an unknown or disabled one, a key header sent twice): "Unauthorized", which API Gateway answers with 401.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerRequestEvent,
    APIGatewayAuthorizerResponse,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.authorizer import TenantKeys
from async_inference.aws import ApiKeyValues
from async_inference.config import AuthorizerSettings

logger = Logger()
tracer = Tracer()
keys = TenantKeys(AuthorizerSettings.load().tenant_api_key_ids, ApiKeyValues())


@logger.inject_lambda_context
# Never capture_response (Powertools' default): the answer holds usageIdentifierKey, the caller's key, and X-Ray keeps
# every response it is given, for anyone with read access to traces (docs/security.md).
@tracer.capture_lambda_handler(capture_response=False)
@event_source(data_class=APIGatewayAuthorizerRequestEvent)
def lambda_handler(event: APIGatewayAuthorizerRequestEvent, context: LambdaContext) -> dict[str, Any]:
    caller = keys.caller(event.headers, event.get("multiValueHeaders"))
    if caller is None:
        logger.info("refused: no known API key", extra={"path": event.path})
        raise Exception("Unauthorized")  # API Gateway's word for a 401: this exact message
    arn = event.parsed_arn
    response = APIGatewayAuthorizerResponse(
        principal_id=caller.tenant,
        region=arn.region,
        aws_account_id=arn.aws_account_id,
        api_id=arn.api_id,
        stage=arn.stage,
        context={"tenant": caller.tenant},
        usage_identifier_key=caller.api_key,
        partition=arn.partition,
    )
    response.allow_all_routes()
    return response.asdict()
