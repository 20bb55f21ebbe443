"""The API function's log keys are per request: a warm function must not log one tenant's request with another's keys.

The handler runs in this process, as one warm execution environment, against the local stack's resources (the
stack fixture exports their names and the moto endpoint); two proxy events go through it one after the other.
"""

from __future__ import annotations

import importlib
import io
import json
from typing import Any

import pytest

from local_runtime.lambda_host import Context

pytestmark = pytest.mark.e2e
LOG = io.StringIO()  # what the handler's logger writes (Lambda's stdout)


def list_jobs_event(tenant: str, request_id: str) -> dict[str, Any]:
    """GET /v1/jobs as API Gateway hands it over once the template's authorizer found the caller's tenant."""
    return {
        "resource": "/v1/jobs",
        "path": "/v1/jobs",
        "httpMethod": "GET",
        "headers": {"x-api-key": "ignored-the-gateway-checked-it"},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "requestContext": {
            "requestId": request_id,
            "resourcePath": "/v1/jobs",
            "httpMethod": "GET",
            "stage": "prod",
            "identity": {"sourceIp": "127.0.0.1"},
            "authorizer": {"tenant": tenant},
        },
        "body": None,
        "isBase64Encoded": False,
    }


@pytest.fixture
def handler(stack, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "AsyncInference")
    module = importlib.import_module("lambdas.api.handler")
    previous = module.logger.registered_handler.setStream(LOG)
    yield module
    module.logger.registered_handler.setStream(previous)


def log_records(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"level"')]


def test_an_error_after_another_tenants_request_is_not_logged_with_that_tenant(handler, monkeypatch):
    # GIVEN a warm API function that has just served tenant A
    served = handler.lambda_handler(list_jobs_event("tenant-a", "request-of-a"), Context(29))
    assert served["statusCode"] == 200, served

    # WHEN tenant B's request fails before its tenant is known (reading the authorizer's answer fails)
    def broken(event: Any) -> str:
        raise RuntimeError("the authorizer context could not be read")

    monkeypatch.setattr(handler, "tenant_of", broken)
    failed = handler.lambda_handler(list_jobs_event("tenant-b", "request-of-b"), Context(29))
    assert failed["statusCode"] == 500, failed
    # THEN its error is logged with its own request id and without tenant A's name
    [error] = [r for r in log_records(LOG.getvalue()) if r["level"] == "ERROR"]
    assert error["correlation_id"] == "request-of-b"
    assert error.get("tenant") != "tenant-a", error
