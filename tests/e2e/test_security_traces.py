"""No secret reaches a trace or a log: the functions whose answers carry a tenant's API key (the authorizer's
``usageIdentifierKey``) or a presigned URL (signature and session token) run under a recording X-Ray recorder, and
nothing it would send to X-Ray, nor anything the functions log, holds the key, a signature or the session token.

Each function runs in this process, as one execution environment of the deployed function: its module imported afresh
with the environment the template gives it (against the local stack's resources), its tracer's provider an
``aws_xray_sdk`` recorder whose emitter keeps each entity as the X-Ray daemon would receive it (``serialize()``).
"""

from __future__ import annotations

import importlib
import io
import json
import sys
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from aws_xray_sdk import global_sdk_config
from aws_xray_sdk.core.context import Context as XRayContext
from aws_xray_sdk.core.recorder import AWSXRayRecorder

from local_runtime.functions import environment_of
from local_runtime.lambda_host import Context
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS

pytestmark = pytest.mark.e2e
KEY = next(key for key, tenant in TENANT_KEYS.items() if tenant == "tenant-a")
# A session token no other string in a trace could hold by chance (the local stack's own is "testing").
SESSION_TOKEN = "session-token-4f1d9c2e7b"
API_ARN = "arn:aws:execute-api:us-east-1:123456789012:abcdef1234/prod/POST/v1/jobs"


class KeptEntities:
    """An X-Ray emitter that keeps what it would send to the daemon."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_entity(self, entity: Any) -> None:
        self.sent.append(entity.serialize())

    def set_daemon_address(self, address: str | None) -> None:
        pass


class Recorded:
    """What the function under test left behind: X-Ray entities and log lines."""

    def __init__(self) -> None:
        self.emitter = KeptEntities()
        self.recorder = AWSXRayRecorder()
        self.recorder.configure(emitter=self.emitter, context=XRayContext(), sampling=False)
        self.log = io.StringIO()

    def text(self) -> str:
        return "\n".join(self.emitter.sent) + "\n" + self.log.getvalue()

    def secrets_in(self, *more: str) -> list[str]:
        text = self.text()
        return [s for s in (KEY, "X-Amz-Signature", "X-Amz-Security-Token", SESSION_TOKEN, *more) if s in text]


def signed_parts(url: str) -> list[str]:
    """The secret parts of a presigned URL: its signature and its session token."""
    query = parse_qs(urlsplit(url).query)
    parts = [query["X-Amz-Signature"][0], query["X-Amz-Security-Token"][0]]
    assert parts[1] == SESSION_TOKEN, parts
    return parts


def function_id(stack: LocalDeployment, handler: str) -> str:
    assert stack.deployment is not None
    [found] = [
        lid
        for lid, r in stack.deployment.assembly.of_type("AWS::Lambda::Function").items()
        if r["Properties"].get("Handler") == handler
    ]
    return found


@pytest.fixture
def traced(stack: LocalDeployment, monkeypatch: pytest.MonkeyPatch):
    """``traced(module)``: the function's module, imported afresh with its deployed environment, tracing to a
    recorder and logging to a buffer; call it in ``recorded.recorder``'s segment."""
    previously = global_sdk_config.sdk_enabled()
    monkeypatch.delenv("AWS_XRAY_SDK_ENABLED", raising=False)

    def load(module_name: str, recorded: Recorded) -> ModuleType:
        assert stack.deployment is not None
        for name, value in environment_of(
            stack.deployment, function_id(stack, f"{module_name}.lambda_handler")
        ).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a fresh session reads the credentials above
        monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "AsyncInference")
        monkeypatch.setenv("AWS_XRAY_CONTEXT_MISSING", "IGNORE_ERROR")  # boto's patch traces to the global recorder
        monkeypatch.delitem(sys.modules, module_name, raising=False)
        module = importlib.import_module(module_name)
        monkeypatch.setattr(module.tracer, "provider", recorded.recorder)
        # After the import: a Tracer made outside Lambda (no LAMBDA_TASK_ROOT) turns the X-Ray SDK off.
        global_sdk_config.set_sdk_enabled(True)
        handler = module.logger.registered_handler
        monkeypatch.setattr(handler, "stream", recorded.log)
        return module

    yield load
    global_sdk_config.set_sdk_enabled(previously)


def run_traced(recorded: Recorded, call: Any) -> Any:
    recorded.recorder.begin_segment("function-under-test")
    try:
        return call()
    finally:
        recorded.recorder.end_segment()


def proxy_event(method: str, resource: str, body: dict[str, Any] | None, tenant: str = "tenant-a") -> dict[str, Any]:
    """A REST API proxy event as API Gateway hands it over once the authorizer found the caller's tenant."""
    return {
        "resource": resource,
        "path": resource,
        "httpMethod": method,
        "headers": {"x-api-key": KEY, "content-type": "application/json"},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "requestContext": {
            "requestId": f"req-{method}-{resource}",
            "resourcePath": resource,
            "httpMethod": method,
            "stage": "prod",
            "identity": {"sourceIp": "127.0.0.1"},
            "authorizer": {"tenant": tenant},
        },
        "body": json.dumps(body) if body is not None else None,
        "isBase64Encoded": False,
    }


def test_the_authorizers_answer_carries_the_key_but_no_trace_or_log_does(traced):
    # GIVEN the authorizer function, tracing
    recorded = Recorded()
    module = traced("lambdas.authorizer.handler", recorded)
    event = {
        "type": "REQUEST",
        "methodArn": API_ARN,
        "resource": "/v1/jobs",
        "path": "/v1/jobs",
        "httpMethod": "POST",
        "headers": {"x-api-key": KEY},
        "queryStringParameters": {},
        "pathParameters": {},
        "stageVariables": {},
        "requestContext": {"requestId": "r1", "stage": "prod", "httpMethod": "POST", "resourcePath": "/v1/jobs"},
    }
    # WHEN it allows a request
    answer = run_traced(recorded, lambda: module.lambda_handler(event, Context(29)))
    # THEN its answer gives API Gateway the key (the usage plan counts by it), and the trace recorded the call
    assert answer["usageIdentifierKey"] == KEY and answer["context"] == {"tenant": "tenant-a"}
    assert any("## lambda_handler" in entity for entity in recorded.emitter.sent), recorded.emitter.sent
    # AND nothing recorded holds the key
    assert recorded.secrets_in() == [], recorded.text()[:2000]


def test_presigned_upload_urls_reach_the_caller_but_no_trace_or_log(traced):
    # GIVEN the API function, tracing
    recorded = Recorded()
    module = traced("lambdas.api.handler", recorded)
    # WHEN a tenant creates an upload job and a file upload, whose answers are presigned PUT URLs
    job = run_traced(
        recorded,
        lambda: module.lambda_handler(proxy_event("POST", "/v1/jobs", {"upload": {"size_bytes": 100}}), Context(29)),
    )
    upload = run_traced(
        recorded,
        lambda: module.lambda_handler(
            proxy_event("POST", "/v1/files/uploads", {"purpose": "batch", "filename": "in.jsonl", "bytes": 100}),
            Context(29),
        ),
    )
    # THEN the caller got the signed URLs, and the trace recorded the calls
    assert job["statusCode"] == 201 and upload["statusCode"] == 201, (job, upload)
    secrets = signed_parts(json.loads(job["body"])["upload"]["url"]) + signed_parts(
        json.loads(upload["body"])["upload"]["url"]
    )
    assert any("create_job" in entity for entity in recorded.emitter.sent), recorded.emitter.sent
    # AND nothing recorded holds a signature, a session token or the key the request came with
    assert recorded.secrets_in(*secrets) == [], recorded.text()[:2000]


def test_a_websocket_connection_with_a_key_leaves_no_key_in_a_trace_or_log(traced, stack: LocalDeployment):
    if stack.ws_url is None:
        pytest.skip("this template has no WebSocket API")
    # GIVEN the WebSocket routes' function, tracing
    recorded = Recorded()
    module = traced("lambdas.websocket.handler", recorded)
    event = {
        "requestContext": {
            "routeKey": "$connect",
            "connectionId": "conn-1",
            "requestId": "r2",
            "stage": "prod",
            "eventType": "CONNECT",
        },
        "headers": {},
        "queryStringParameters": {"api_key": KEY},
        "isBase64Encoded": False,
    }
    # WHEN a client connects with its key in the query string
    answer = run_traced(recorded, lambda: module.lambda_handler(event, Context(29)))
    # THEN it is connected, and nothing recorded holds its key
    assert answer["statusCode"] == 200, answer
    assert recorded.emitter.sent
    assert recorded.secrets_in() == [], recorded.text()[:2000]
