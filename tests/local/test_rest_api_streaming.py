"""The local gateway streams a method's response when the template's integration says STREAM, as API Gateway's REST
response streaming does: the status and headers from the function's stream metadata, then each piece of the body as
the function produces it; a BUFFERED integration still answers once, whole."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from local_runtime.deployer import Deployment
from local_runtime.functions import LocalFunction
from local_runtime.moto_server import LOCAL_KEYS, MotoServer, free_port
from local_runtime.rest_api import RestApi, serve
from local_runtime.template import Assembly
from tests.local.assemblies import python_function, write_assembly

# Three pieces, 0.4 s apart: a client that gets the first piece long before the last got it while the function still ran.
HANDLER = {
    "handler.py": (
        "import time\n"
        "def pieces():\n"
        "    for i in range(3):\n"
        "        if i:\n"
        "            time.sleep(0.4)\n"
        "        yield f'data: {i}\\n\\n'\n"
        "def handle(event, context):\n"
        "    return {'statusCode': 201, 'headers': {'Content-Type': 'text/event-stream'}, 'body': pieces()}\n"
        "def whole(event, context):\n"
        "    return {'statusCode': 200, 'body': ''.join(pieces())}\n"
        "def fail(event, context):\n"
        "    raise ValueError('no stream')\n"
    )
}


def uri(action: str) -> dict[str, Any]:
    """The integration URI CDK writes: ``invocations``, or ``response-streaming-invocations`` for STREAM."""
    return {
        "Fn::Join": [
            "",
            [
                "arn:aws:apigateway:us-east-1:lambda:path/2021-11-15/functions/",
                {"Fn::GetAtt": ["Fn", "Arn"]},
                f"/{action}",
            ],
        ]
    }


def method(resource: str, transfer_mode: str | None) -> dict[str, Any]:
    integration: dict[str, Any] = {"Type": "AWS_PROXY", "IntegrationHttpMethod": "POST"}
    if transfer_mode == "STREAM":
        integration.update(Uri=uri("response-streaming-invocations"), ResponseTransferMode="STREAM")
    else:
        integration["Uri"] = uri("invocations")
    return {
        "Type": "AWS::ApiGateway::Method",
        "Properties": {
            "RestApiId": {"Ref": "Api"},
            "ResourceId": {"Ref": resource},
            "HttpMethod": "GET",
            "AuthorizationType": "NONE",
            "Integration": integration,
        },
    }


def resource(path: str) -> dict[str, Any]:
    return {
        "Type": "AWS::ApiGateway::Resource",
        "Properties": {
            "RestApiId": {"Ref": "Api"},
            "ParentId": {"Fn::GetAtt": ["Api", "RootResourceId"]},
            "PathPart": path,
        },
    }


@pytest.fixture
def gateway(moto: MotoServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[int]:
    """The local gateway of a template with a STREAM method (/stream) and a BUFFERED one (/buffered) on one function
    (its handler: ``request.param``, default ``handler.handle``); its port."""

    def clients(service: str) -> Any:
        return boto3.client(
            service, endpoint_url=moto.url, region_name="us-east-1", **{k.lower(): v for k, v in LOCAL_KEYS.items()}
        )

    handler = getattr(request, "param", "handler.handle")
    resources = {
        "Fn": python_function("asset.code", handler, timeout=10),
        "Api": {"Type": "AWS::ApiGateway::RestApi", "Properties": {"Name": "api"}},
        "StreamResource": resource("stream"),
        "BufferedResource": resource("buffered"),
        "StreamMethod": method("StreamResource", "STREAM"),
        "BufferedMethod": method("BufferedResource", None),
    }
    assembly = Assembly.load(write_assembly(tmp_path / "cdk.out", resources, {"asset.code": HANDLER}))
    deployment = Deployment(assembly, clients, api_key_values={}).deploy()
    function = LocalFunction(deployment, "Fn", extra_env={}).start().wait_ready()
    port = free_port()
    server = serve(RestApi(deployment, "Api", functions={"Fn": function}), "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield port
    server.shutdown()
    function.stop()


def get(port: int, path: str) -> tuple[http.client.HTTPResponse, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    started = time.monotonic()
    connection.request("GET", path)
    return connection.getresponse(), started


def test_a_stream_integration_sends_the_first_piece_while_the_function_still_runs(gateway: int):
    # GIVEN a method whose integration's ResponseTransferMode is STREAM, on a function that takes 0.8 s
    # WHEN a client calls it
    response, started = get(gateway, "/stream")
    first = response.read1(65536)
    first_at = time.monotonic() - started
    rest = response.read()
    rest_at = time.monotonic() - started
    # THEN the status and headers are the stream metadata's, the body is chunked, and the first piece came while the
    # function still ran, well before the last piece 0.8 s later (sent together at the end, they would come together)
    assert response.status == 201 and response.getheader("Content-Type") == "text/event-stream"
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert first == b"data: 0\n\n" and rest_at - first_at >= 0.4
    assert rest == b"data: 1\n\ndata: 2\n\n"


@pytest.mark.parametrize("gateway", ["handler.whole"], indirect=True)
def test_a_buffered_integration_answers_once_with_the_whole_body(gateway: int):
    # GIVEN a function that takes 0.8 s behind a BUFFERED integration (the default)
    response, started = get(gateway, "/buffered")
    body = response.read1(65536)
    # THEN nothing came before the function ended, and then all of it, with its length
    assert time.monotonic() - started >= 0.8
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and response.getheader("Content-Length") == str(len(body))


@pytest.mark.parametrize("gateway", ["handler.fail"], indirect=True)
def test_a_function_that_fails_before_its_stream_is_an_integration_failure(gateway: int):
    response, _ = get(gateway, "/stream")
    assert response.status == 502 and b"Internal server error" in response.read()
