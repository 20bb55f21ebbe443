"""The authorizer's key-to-tenant mapping (Bearer or x-api-key), its cache, and the local gateway's emulation of a
REQUEST authorizer (identity sources, TTL cache, policy, context)."""

from __future__ import annotations

from typing import Any

import pytest

from async_inference.authorizer import TenantKeys, presented_keys
from async_inference.aws import ApiKeyValues
from local_runtime.authorizers import AuthorizerRefused, Request, RequestAuthorizer
from local_runtime.functions import InvokeResult


class Keys:
    """API Gateway's GetApiKeys as the authorizer sees it (every key of the region), counting the reads."""

    def __init__(self, keys: dict[str, tuple[str, bool]]) -> None:
        self.keys = keys
        self.reads = 0

    def __call__(self) -> dict[str, tuple[str, bool]]:
        self.reads += 1
        return dict(self.keys)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("headers", "keys"),
    [
        ({"Authorization": "Bearer k1"}, ["k1"]),
        ({"authorization": "bearer k1"}, ["k1"]),
        ({"x-api-key": "k2"}, ["k2"]),
        ({"Authorization": "Bearer k1", "X-Api-Key": "k2"}, ["k1", "k2"]),
        ({"Authorization": "Basic k1"}, []),
        ({"Authorization": "Bearer "}, []),
        ({}, []),
    ],
)
def test_the_keys_a_request_presents(headers, keys):
    assert presented_keys(headers) == keys


def directory(clock: Clock, keys: Keys) -> TenantKeys:
    return TenantKeys({"a": "id-a", "b": "id-b"}, keys, clock=clock, ttl_s=300, refresh_min_s=10)


def test_either_header_maps_to_the_tenant_and_keys_of_two_tenants_are_refused():
    keys = Keys({"id-a": ("key-a", True), "id-b": ("key-b", True)})
    tenants = directory(Clock(), keys)
    assert tenants.caller({"Authorization": "Bearer key-a"}).tenant == "a"
    assert tenants.caller({"x-api-key": "key-b"}).tenant == "b"
    assert tenants.caller({"Authorization": "Bearer key-a", "x-api-key": "key-a"}).tenant == "a"
    assert tenants.caller({"Authorization": "Bearer key-a", "x-api-key": "key-b"}) is None
    assert tenants.caller({"x-api-key": "nobody"}) is None
    assert tenants.caller({}) is None


def test_a_key_header_repeated_is_refused_whatever_its_values():
    # GIVEN API Gateway's event for two x-api-key headers: headers holds the last, multiValueHeaders both
    tenants = directory(Clock(), Keys({"id-a": ("key-a", True), "id-b": ("key-b", True)}))
    for values in (["key-a", "key-b"], ["key-a", "key-a"]):
        # WHEN the caller is looked up THEN it is refused, not served as the last value's tenant
        assert tenants.caller({"x-api-key": values[-1]}, {"X-Api-Key": values}) is None
    # AND one value of each header, as multiValueHeaders carries any request's, is served
    assert tenants.caller({"x-api-key": "key-a"}, {"x-api-key": ["key-a"], "Accept": ["a", "b"]}).tenant == "a"


def test_a_disabled_key_is_refused():
    tenants = directory(Clock(), Keys({"id-a": ("key-a", False), "id-b": ("key-b", True)}))
    assert tenants.caller({"x-api-key": "key-a"}) is None


def test_keys_are_read_once_per_ttl_and_unknown_values_cannot_force_reads():
    clock, keys = Clock(), Keys({"id-a": ("key-a", True), "id-b": ("key-b", True)})
    tenants = directory(clock, keys)
    for _ in range(50):
        tenants.caller({"x-api-key": "key-a"})
        tenants.caller({"x-api-key": "guess"})
    assert keys.reads == 1  # one read of every key, for all 100 requests
    clock.now = 11
    tenants.caller({"x-api-key": "guess"})
    assert keys.reads == 2  # an unknown value re-reads at most every refresh_min_s
    keys.keys["id-a"] = ("key-a", False)  # disabled meanwhile
    clock.now = 400
    assert tenants.caller({"x-api-key": "key-a"}) is None  # seen at the next read after the TTL


# --- The local gateway's REQUEST authorizer -------------------------------------------------------------------------


class Function:
    def __init__(self, answer: Any, error: bool = False) -> None:
        self.answer, self.error, self.events = answer, error, []

    def invoke(self, event: dict[str, Any]) -> InvokeResult:
        self.events.append(event)
        return InvokeResult(payload=self.answer, error=self.error)


ARN = "arn:aws:execute-api:us-east-1:123456789012:api/prod/GET/v1/jobs"


def allow(resource: str = "arn:aws:execute-api:us-east-1:123456789012:api/prod/*/*", effect: str = "Allow") -> dict:
    return {
        "principalId": "t",
        "context": {"tenant": "t"},
        "usageIdentifierKey": "key",
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": effect, "Resource": [resource]}],
        },
    }


def request(headers: dict[str, str] | None = None) -> Request:
    return Request(
        method_arn=ARN,
        resource="/v1/jobs",
        path="/v1/jobs",
        http_method="GET",
        headers=headers or {},
        query={},
        path_parameters={},
        request_context={"stage": "prod"},
    )


def test_with_caching_a_missing_identity_source_is_401_without_a_call_and_results_are_cached_per_value():
    function, clock = Function(allow()), Clock()
    authorizer = RequestAuthorizer(
        "A",
        {
            "Type": "REQUEST",
            "IdentitySource": "method.request.header.Authorization",
            "AuthorizerResultTtlInSeconds": 60,
        },
        function,
        clock=clock,
    )  # type: ignore[arg-type]
    with pytest.raises(AuthorizerRefused) as refused:
        authorizer.authorize(request({"x-api-key": "key"}))
    assert refused.value.response_type == "UNAUTHORIZED" and function.events == []
    for _ in range(3):
        assert authorizer.authorize(request({"Authorization": "Bearer key"})).context == {"tenant": "t"}
    assert len(function.events) == 1  # cached for the TTL, by the identity source's value
    authorizer.authorize(request({"Authorization": "Bearer other"}))
    clock.now = 61
    authorizer.authorize(request({"Authorization": "Bearer key"}))
    assert len(function.events) == 3
    assert function.events[0]["type"] == "REQUEST" and function.events[0]["methodArn"] == ARN


def test_without_caching_every_request_calls_the_function_whatever_its_headers():
    function = Function(allow())
    authorizer = RequestAuthorizer("A", {"Type": "REQUEST", "AuthorizerResultTtlInSeconds": 0}, function)  # type: ignore[arg-type]
    for headers in ({}, {"x-api-key": "k"}, {"Authorization": "Bearer k"}):
        found = authorizer.authorize(request(headers))
        assert (found.principal_id, found.usage_identifier_key) == ("t", "key")
    assert [e["headers"] for e in function.events] == [{}, {"x-api-key": "k"}, {"Authorization": "Bearer k"}]


@pytest.mark.parametrize(
    ("function", "response_type"),
    [
        (Function({"errorMessage": "Unauthorized"}, error=True), "UNAUTHORIZED"),
        (Function({"errorMessage": "boom"}, error=True), "AUTHORIZER_FAILURE"),
        (Function({"principalId": "t"}), "AUTHORIZER_CONFIGURATION_ERROR"),
        (Function(allow(effect="Deny")), "ACCESS_DENIED"),
        (Function(allow(resource="arn:aws:execute-api:us-east-1:123456789012:api/prod/POST/*")), "ACCESS_DENIED"),
    ],
)
def test_refusals_are_the_gateway_responses_api_gateway_gives(function, response_type):
    authorizer = RequestAuthorizer("A", {"Type": "REQUEST", "AuthorizerResultTtlInSeconds": 0}, function)  # type: ignore[arg-type]
    with pytest.raises(AuthorizerRefused) as refused:
        authorizer.authorize(request())
    assert refused.value.response_type == response_type


def test_caching_without_an_identity_source_is_refused_as_api_gateway_refuses_it():
    with pytest.raises(ValueError, match="no identity source"):
        RequestAuthorizer("A", {"Type": "REQUEST"}, Function(allow()))  # type: ignore[arg-type]


class ApiGateway:
    """API Gateway's GetApiKeys over ``count`` keys, in pages of the limit asked for, counting the calls."""

    def __init__(self, count: int) -> None:
        self.items = [{"id": f"id-{n}", "value": f"key-{n}", "enabled": True} for n in range(count)]
        self.calls = 0

    def get_api_keys(self, *, includeValues: bool, limit: int, position: str = "0") -> dict[str, Any]:
        self.calls += 1
        start = int(position)
        page = {
            "items": [item if includeValues else {**item, "value": None} for item in self.items][start : start + limit]
        }
        return {**page, "position": str(start + limit)} if start + limit < len(self.items) else page


def test_a_refresh_of_a_hundred_tenants_rotating_keys_is_one_api_gateway_call():
    # GIVEN 100 tenants with two keys each (200 keys: a GetApiKey per key id made 200 calls a refresh)
    gateway = ApiGateway(200)
    key_ids = {f"t{n}": [f"id-{2 * n}", f"id-{2 * n + 1}"] for n in range(100)}
    tenants = TenantKeys(key_ids, ApiKeyValues(gateway), clock=Clock())
    # WHEN a request is authorized (the cache is read)
    caller = tenants.caller({"x-api-key": "key-199"})
    # THEN it is the key's tenant, read with one call
    assert caller.tenant == "t99" and gateway.calls == 1


def test_more_keys_than_a_page_are_read_page_by_page():
    # GIVEN more keys in the region than one GetApiKeys page holds
    gateway = ApiGateway(ApiKeyValues.PAGE_SIZE + 1)
    # WHEN every key is read
    keys = ApiKeyValues(gateway)()
    # THEN the last page's key is there too, after two calls
    assert len(keys) == ApiKeyValues.PAGE_SIZE + 1 and gateway.calls == 2
