"""The Responses API in the template: its REST resources and methods, each proxied to the API function."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cdk
STREAMED = {("POST", "/v1/responses"), ("GET", "/v1/responses/{response_id}")}


def _paths(synthesized) -> dict[str, str]:
    """Each API Gateway resource's logical id -> its full path, from the resources' PathPart and ParentId."""
    resources = synthesized.resources("AWS::ApiGateway::Resource")
    paths: dict[str, str] = {}

    def path(logical_id: str) -> str:
        if logical_id not in paths:
            props = resources[logical_id]["Properties"]
            parent = props["ParentId"]
            above = path(parent["Ref"]) if isinstance(parent, dict) and "Ref" in parent else ""
            paths[logical_id] = f"{above}/{props['PathPart']}"
        return paths[logical_id]

    for logical_id in resources:
        path(logical_id)
    return paths


def test_the_responses_routes_exist_and_reach_the_api_function(synthesized):
    """GIVEN the REST API WHEN listing its methods by path THEN the five routes of OpenAI's Responses API are there,
    each a Lambda proxy to the API function (the function that also serves the jobs routes), but the create and the
    GET, which may stream, to the streaming function (tests/cdk/test_streaming_function.py)."""
    paths = _paths(synthesized)
    methods = synthesized.resources("AWS::ApiGateway::Method").values()
    routes = {
        (m["Properties"]["HttpMethod"], paths.get(m["Properties"]["ResourceId"].get("Ref", ""), "/")) for m in methods
    }
    expected = {
        ("POST", "/v1/responses"),
        ("GET", "/v1/responses/{response_id}"),
        ("DELETE", "/v1/responses/{response_id}"),
        ("POST", "/v1/responses/{response_id}/cancel"),
        ("GET", "/v1/responses/{response_id}/input_items"),
    }
    assert expected <= routes
    [jobs_post] = [
        m
        for m in methods
        if paths.get(m["Properties"]["ResourceId"].get("Ref", "")) == "/v1/jobs"
        and m["Properties"]["HttpMethod"] == "POST"
    ]
    for method in methods:
        route = (method["Properties"]["HttpMethod"], paths.get(method["Properties"]["ResourceId"].get("Ref", "")))
        if route in expected:
            assert method["Properties"]["Integration"]["Type"] == "AWS_PROXY"
        if route in expected - STREAMED:
            assert method["Properties"]["Integration"]["Uri"] == jobs_post["Properties"]["Integration"]["Uri"]


def test_a_response_id_in_the_path_is_a_required_parameter(synthesized):
    """GIVEN the routes under /v1/responses/{response_id} WHEN reading their request parameters THEN the id is
    required, so API Gateway's validator refuses a request without it."""
    paths = _paths(synthesized)
    by_id = [
        m
        for m in synthesized.resources("AWS::ApiGateway::Method").values()
        if paths.get(m["Properties"]["ResourceId"].get("Ref", ""), "").startswith("/v1/responses/")
    ]
    assert len(by_id) == 4  # GET, DELETE, cancel, input_items
    assert all(m["Properties"]["RequestParameters"] == {"method.request.path.response_id": True} for m in by_id)
