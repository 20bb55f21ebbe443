"""The fleets' custom resource function answers CloudFormation on the request's ResponseURL, always: SUCCESS with the
step's data, FAILED with the reason when the step raised (an unanswered custom resource keeps a stack waiting an
hour)."""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from moto import mock_aws


@pytest.fixture
def answers() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local stand-in for CloudFormation's presigned response URL, recording what is PUT to it."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 (http.server's name)
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/response", received
    server.shutdown()


@pytest.fixture
def handler(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():  # ECS without the stack's cluster yet: a new stack
        # Its clients are made at import: reloaded inside the mock, not those of a local stack that imported it first.
        yield importlib.reload(importlib.import_module("lambdas.fleet_deploy_steps.handler"))


class _Context:
    function_name = "steps"
    memory_limit_in_mb = 128
    invoked_function_arn = "arn:aws:lambda:us-east-1:111122223333:function:steps"
    aws_request_id = "r"


def _event(url: str, resource_type: str) -> dict[str, Any]:
    return {
        "RequestType": "Create",
        "ResponseURL": url,
        "StackId": "arn:aws:cloudformation:us-east-1:111122223333:stack/s/1",
        "RequestId": "req-1",
        "LogicalResourceId": "DesiredCount",
        "ResourceType": resource_type,
        "ResourceProperties": {"Cluster": "c", "Service": "gpu-workers"},
    }


def test_a_create_answers_success_with_the_desired_count(handler, answers):
    url, received = answers
    handler.lambda_handler(_event(url, "Custom::WorkerDesiredCount"), _Context())
    [answer] = received
    assert answer["Status"] == "SUCCESS" and answer["Data"] == {"DesiredCount": 0}
    assert answer["RequestId"] == "req-1" and answer["LogicalResourceId"] == "DesiredCount"


def test_a_step_that_raises_answers_failed_with_the_reason(handler, answers):
    url, received = answers
    handler.lambda_handler(_event(url, "Custom::Unknown"), _Context())
    [answer] = received
    assert answer["Status"] == "FAILED" and "Custom::Unknown" in answer["Reason"]
    assert answer["PhysicalResourceId"] == "req-1"
