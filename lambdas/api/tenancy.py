"""The caller's tenant, as the REST API's authorizer found it (``lambdas/authorizer``): never from the request itself."""

from __future__ import annotations

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

from async_inference.jobs_service import ErrorKind, ServiceError


def tenant_of(event: APIGatewayProxyEvent) -> str:
    tenant = event.request_context.authorizer.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        raise ServiceError(
            ErrorKind.FORBIDDEN, "forbidden", "the request reached the API without a tenant from its authorizer"
        )
    return tenant
