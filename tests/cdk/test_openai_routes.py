"""OpenAI's request routes in the template (lambdas/api/openai_routes.py): each a method proxied to the API function,
whose timeout is API Gateway's integration timeout, so a held request is answered by the function, not a bare 504."""

from __future__ import annotations

import pytest

from async_inference import settings
from async_inference.sync_wait import MAX_WAIT_S
from tests.cdk.test_responses_routes import _paths

pytestmark = pytest.mark.cdk
HELD_ROUTES = {("POST", "/v1/embeddings")}
# Routes that may stream: proxied to the streaming function with a STREAM integration (tests/cdk/test_streaming_function.py)
STREAMED_ROUTES = {
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
}


def methods_by_route(synthesized) -> dict:
    paths = _paths(synthesized)
    return {
        (m["Properties"]["HttpMethod"], paths.get(m["Properties"]["ResourceId"].get("Ref", ""), "/")): m
        for m in synthesized.resources("AWS::ApiGateway::Method").values()
    }


def test_the_openai_routes_exist_and_reach_the_api_function(synthesized):
    # GIVEN the REST API WHEN listing its methods by path THEN the embeddings route is a Lambda proxy to the function
    # that serves POST /v1/jobs, and the routes that may stream are Lambda proxies too (to the streaming function)
    methods = methods_by_route(synthesized)
    assert HELD_ROUTES | STREAMED_ROUTES <= set(methods)
    jobs_uri = methods[("POST", "/v1/jobs")]["Properties"]["Integration"]["Uri"]
    for route in HELD_ROUTES:
        integration = methods[route]["Properties"]["Integration"]
        assert (integration["Type"], integration["Uri"]) == ("AWS_PROXY", jobs_uri)
    for route in HELD_ROUTES | STREAMED_ROUTES:
        assert methods[route]["Properties"]["Integration"]["Type"] == "AWS_PROXY"
        assert methods[route]["Properties"]["AuthorizationType"] == "CUSTOM"


def test_the_longest_wait_ends_before_the_api_function_times_out(synthesized):
    # GIVEN the API function WHEN reading its timeout THEN the held wait ends before it, leaving time to answer
    [timeout] = [
        f["Properties"]["Timeout"]
        for f in synthesized.resources("AWS::Lambda::Function").values()
        if f["Properties"].get("Handler") == "lambdas.api.handler.lambda_handler"
    ]
    assert timeout == settings.API_FUNCTION_TIMEOUT_S and MAX_WAIT_S < timeout
