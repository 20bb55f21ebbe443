"""The streaming API function (cdk/streaming_function.py): the API's handler under Lambda Web Adapter in
response-stream mode, behind STREAM integrations for the routes that may stream."""

from __future__ import annotations

import pytest

from async_inference.streaming.asgi import ENV_PROXY_HANDLER
from cdk.streaming_function import ADAPTER_ENVIRONMENT, START_COMMAND, WEB_ADAPTER_ACCOUNT
from tests.cdk.test_openai_routes import HELD_ROUTES, STREAMED_ROUTES, methods_by_route

pytestmark = pytest.mark.cdk
API = "lambdas.api.handler.lambda_handler"


def _functions(synthesized) -> tuple[dict, dict, str]:
    functions = synthesized.resources("AWS::Lambda::Function")
    [api] = [f for f in functions.values() if f["Properties"]["Handler"] == API]
    [(stream_id, stream)] = [(i, f) for i, f in functions.items() if f["Properties"]["Handler"] == START_COMMAND]
    return api, stream, stream_id


def test_the_streaming_function_runs_the_api_handler_under_the_web_adapter(synthesized):
    # GIVEN the service WHEN reading the streaming function THEN it starts the adapter in response-stream mode, names
    # the API's handler as the one its ASGI app serves, and has the adapter's layer beside the shared one
    _, stream, _ = _functions(synthesized)
    variables = stream["Properties"]["Environment"]["Variables"]
    assert {k: variables[k] for k in ADAPTER_ENVIRONMENT} == ADAPTER_ENVIRONMENT
    assert variables["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert variables[ENV_PROXY_HANDLER] == API
    layers = [layer for layer in stream["Properties"]["Layers"] if WEB_ADAPTER_ACCOUNT in str(layer)]
    assert len(layers) == 1 and "LambdaAdapterLayerX86" in str(layers[0])


def test_the_streaming_function_has_the_api_functions_role_and_environment(synthesized):
    # GIVEN both functions WHEN comparing them THEN they share the role (every grant) and every service variable
    api, stream, _ = _functions(synthesized)
    assert stream["Properties"]["Role"] == api["Properties"]["Role"]
    variables = stream["Properties"]["Environment"]["Variables"]
    api_variables = api["Properties"]["Environment"]["Variables"]
    assert {k: v for k, v in variables.items() if k not in ADAPTER_ENVIRONMENT and k != ENV_PROXY_HANDLER} == (
        api_variables
    )


def test_a_stream_may_last_as_long_as_api_gateway_holds_one(synthesized):
    # GIVEN the streaming function WHEN reading its timeout THEN it is API Gateway's 15-minute streaming limit
    _, stream, _ = _functions(synthesized)
    assert stream["Properties"]["Timeout"] == 900


def test_the_routes_that_may_stream_have_stream_integrations_to_the_streaming_function(synthesized):
    # GIVEN the REST API WHEN reading each route's integration THEN those that may stream are STREAM integrations
    # invoking the streaming function with response streaming; the others stay buffered on the API function
    methods = methods_by_route(synthesized)
    _, _, stream_id = _functions(synthesized)
    for route in STREAMED_ROUTES:
        integration = methods[route]["Properties"]["Integration"]
        assert integration["ResponseTransferMode"] == "STREAM", route
        assert integration["TimeoutInMillis"] == 900_000, route  # API Gateway holds a stream up to 15 minutes
        assert "response-streaming-invocations" in str(integration["Uri"]) and stream_id in str(integration["Uri"])
    for route in HELD_ROUTES | {("POST", "/v1/jobs")}:
        assert methods[route]["Properties"]["Integration"].get("ResponseTransferMode", "BUFFERED") == "BUFFERED"
