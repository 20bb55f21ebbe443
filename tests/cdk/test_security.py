"""Security defaults of the synthesized template (issue #16): per-tenant quotas reach the API from the `tenants`
context, and the index they are counted on holds keys only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Match

from async_inference import settings
from async_inference.config import ENV_REQUEST_LIMITS, ENV_TENANT_QUOTAS
from async_inference.limits import RequestLimits
from tests.cdk.helpers import function_role, role_actions

API = "lambdas.api.handler.lambda_handler"
CONTROLLER = "lambdas.batch_controller.handler.lambda_handler"
UPLOAD = "lambdas.upload.handler.lambda_handler"


def function(synthesized, handler: str) -> dict[str, Any]:
    [found] = [
        r for r in synthesized.resources("AWS::Lambda::Function").values() if r["Properties"].get("Handler") == handler
    ]
    return found


def test_each_tenants_limits_reach_the_api_and_the_batch_controller_from_the_tenants_context(synth_variant):
    # GIVEN a tenant whose plan sets its three limits, and one whose plan sets none
    small = {"max_active_jobs": 5, "max_batch_lines_in_flight": 500, "max_stored_bytes": 1_000_000}
    synthesized = synth_variant(tenants={"small": small, "plain": {}})
    # WHEN the API function's and the batch controller's environments are read
    for handler in (API, CONTROLLER):
        quotas = json.loads(synthesized.variables(handler)[ENV_TENANT_QUOTAS])
        # THEN each tenant has its limits, the defaults where its plan sets none
        assert quotas == {
            "small": small,
            "plain": {
                "max_active_jobs": settings.DEFAULT_MAX_ACTIVE_JOBS,
                "max_batch_lines_in_flight": settings.DEFAULT_MAX_BATCH_LINES_IN_FLIGHT,
                "max_stored_bytes": settings.DEFAULT_MAX_STORED_BYTES,
            },
        }


def test_the_request_limits_reach_the_api_and_the_upload_handler_per_deployment_and_per_tenant(synth_variant):
    # GIVEN a deployment that lowers the context, and a tenant whose plan raises n x max_tokens
    synthesized = synth_variant(
        request_limits={"context_tokens": 8192}, tenants={"big": {"request_limits": {"max_request_tokens": 32768}}}
    )
    for handler in (API, UPLOAD):
        variables = synthesized.variables(handler)
        # THEN both functions hold requests to the deployment's limits, the defaults where it sets none
        assert RequestLimits.model_validate_json(variables[ENV_REQUEST_LIMITS]) == RequestLimits(context_tokens=8192)
        # AND the tenant's plan reaches them with its overrides
        assert json.loads(variables[ENV_TENANT_QUOTAS])["big"]["request_limits"] == {"max_request_tokens": 32768}


def test_a_misspelt_request_limit_in_a_plan_is_refused_at_synth(synth_variant):
    with pytest.raises(ValueError, match="max_schema_byte"):
        synth_variant(tenants={"typo": {"request_limits": {"max_schema_byte": 1}}})


@pytest.mark.parametrize("limit", ["max_active_jobs", "max_batch_lines_in_flight", "max_stored_bytes"])
def test_a_non_positive_limit_is_refused_at_synth(synth_variant, limit: str):
    # WHEN a tenant's plan sets a limit to 0 THEN the app refuses to build, naming the option
    with pytest.raises(ValueError, match=f"{limit}.* must be positive"):
        synth_variant(tenants={"zero": {limit: 0}})


def test_the_batches_in_flight_index_is_sparse_with_line_counts_and_the_api_and_controller_may_query_it(synthesized):
    # GIVEN the batch table WHEN its indexes are read THEN the quota index is keyed on the active attribute and
    # carries each batch's line count
    synthesized.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "GlobalSecondaryIndexes": Match.array_with(
                [
                    {
                        "IndexName": settings.BATCH_ACTIVE_INDEX_NAME,
                        "KeySchema": [{"AttributeName": settings.BATCH_ACTIVE_ATTRIBUTE, "KeyType": "HASH"}],
                        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["total"]},
                    }
                ]
            ),
        },
    )
    # AND the API (at POST /v1/batches) and the controller (once it has counted a batch's lines) may query it
    for handler in (API, CONTROLLER):
        role = function_role(synthesized.template, handler)
        queried = json.dumps(role_actions(synthesized.template, role)["dynamodb:Query"])
        assert f"/index/{settings.BATCH_ACTIVE_INDEX_NAME}" in queried


def test_the_unfinished_jobs_index_is_sparse_and_keys_only_and_the_api_may_query_it(synthesized):
    # GIVEN the job table WHEN its indexes are read THEN the quota index is keyed on the active attribute, keys only
    synthesized.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "GlobalSecondaryIndexes": Match.array_with(
                [
                    {
                        "IndexName": settings.ACTIVE_JOBS_INDEX_NAME,
                        "KeySchema": [{"AttributeName": settings.ACTIVE_JOBS_ATTRIBUTE, "KeyType": "HASH"}],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    }
                ]
            ),
        },
    )
    # AND the API function may query it (and no other table-wide read is added for it)
    queried = json.dumps(role_actions(synthesized.template, function_role(synthesized.template, API))["dynamodb:Query"])
    assert f"/index/{settings.ACTIVE_JOBS_INDEX_NAME}" in queried


# --- Result-topic subscriptions by tenant ---------------------------------------------------------------------------


def test_a_tenant_scoped_subscription_filters_on_its_tenant_and_status(synth_variant):
    # GIVEN a subscription given to tenant acme, for its failed jobs
    synthesized = synth_variant(
        tenants={"acme": {}, "other": {}},
        subscriptions=[
            {
                "protocol": "sqs",
                "endpoint": "arn:aws:sqs:us-east-1:111122223333:acme-results",
                "tenants": ["acme"],
                "tenant_scoped": True,
                "statuses": ["failed"],
            }
        ],
    )
    # WHEN the template is read THEN its filter policy admits acme's notifications only
    synthesized.template.has_resource_properties(
        "AWS::SNS::Subscription",
        {
            "Endpoint": "arn:aws:sqs:us-east-1:111122223333:acme-results",
            "FilterPolicy": {"status": ["failed"], "tenant": ["acme"]},
        },
    )


@pytest.mark.parametrize(
    "subscription",
    [
        {"tenant_scoped": True},
        {"tenant_scoped": True, "tenants": ["acme", "other"]},
        {"tenant_scoped": True, "tenants": []},
    ],
)
def test_a_tenant_scoped_subscription_without_exactly_one_tenant_is_refused(synth_variant, subscription):
    # WHEN a tenant-scoped subscription would receive more than one tenant's results THEN the app refuses to build
    with pytest.raises(ValueError, match="must name exactly one tenant|must be a non-empty list of tenant ids"):
        synth_variant(
            tenants={"acme": {}, "other": {}},
            subscriptions=[{"protocol": "https", "endpoint": "https://acme.example.com/results", **subscription}],
        )


def test_a_subscription_naming_an_unknown_tenant_is_refused(synth_variant):
    # WHEN a subscription filters on a tenant the stack does not have THEN the app refuses to build, naming it
    with pytest.raises(ValueError, match=r"tenants \['ghost'\] are not among the stack's tenants"):
        synth_variant(
            tenants={"acme": {}},
            subscriptions=[{"protocol": "https", "endpoint": "https://x.example.com/r", "tenants": ["ghost"]}],
        )


# --- Keys: rotation with two keys per tenant -------------------------------------------------------------------------

AUTHORIZER = "lambdas.authorizer.handler.lambda_handler"


def test_a_tenant_with_two_keys_has_both_in_its_usage_plan_and_both_reach_the_authorizer(synth_variant):
    # GIVEN a tenant rotating from its old key to a new one
    synthesized = synth_variant(tenants={"acme": {"api_keys": ["acme", "acme-2026"]}, "other": {}})
    keys = synthesized.resources("AWS::ApiGateway::ApiKey")
    by_name = {key["Properties"]["Name"]: logical_id for logical_id, key in keys.items()}
    # THEN both keys exist, the old one under the logical id it had before the rotation (so it is not replaced)
    assert set(by_name) == {"acme", "acme-2026", "other"}
    before = synth_variant(tenants={"acme": {}, "other": {}}).resources("AWS::ApiGateway::ApiKey")
    assert by_name["acme"] in before
    # AND both are keys of acme's usage plan
    plan_keys = [
        r["Properties"]["KeyId"]["Ref"] for r in synthesized.resources("AWS::ApiGateway::UsagePlanKey").values()
    ]
    assert {by_name["acme"], by_name["acme-2026"], by_name["other"]} == set(plan_keys)
    # AND the authorizer maps both ids to acme
    ids = synthesized.variables(AUTHORIZER)["TENANT_API_KEY_IDS"]
    rendered = json.dumps(ids)
    assert by_name["acme"] in rendered and by_name["acme-2026"] in rendered and "[" in rendered


@pytest.mark.parametrize(
    ("tenants", "says"),
    [
        ({"acme": {"api_keys": ["a1", "a2", "a3"]}}, "at most 2 key names"),
        ({"acme": {"api_keys": ["shared"]}, "other": {"api_keys": ["shared"]}}, "unique across tenants"),
        ({"acme": {"api_keys": ["Not_Valid"]}}, "must match"),
    ],
)
def test_key_lists_that_cannot_hold_are_refused_at_synth(synth_variant, tenants, says):
    with pytest.raises(ValueError, match=says):
        synth_variant(tenants=tenants)


# --- WAF (optional) --------------------------------------------------------------------------------------------------


def test_no_web_acl_by_default(synthesized):
    assert synthesized.resources("AWS::WAFv2::WebACL") == {}


def test_the_waf_option_puts_a_rate_limiting_web_acl_on_the_rest_stage(synth_variant):
    # GIVEN the option set WHEN the template is read
    synthesized = synth_variant(waf_requests_per_5_min_per_ip=1000)
    # THEN a regional web ACL blocks an IP over 1000 requests in 5 minutes, with AWS's reputation and bad-input groups
    [(acl_id, acl)] = synthesized.resources("AWS::WAFv2::WebACL").items()
    rules = {rule["Name"]: rule for rule in acl["Properties"]["Rules"]}
    assert acl["Properties"]["Scope"] == "REGIONAL"
    assert rules["RequestsPerIp"]["Statement"]["RateBasedStatement"] == {"Limit": 1000, "AggregateKeyType": "IP"}
    assert set(rules) == {
        "RequestsPerIp",
        "AWSManagedRulesAmazonIpReputationList",
        "AWSManagedRulesKnownBadInputsRuleSet",
    }
    # AND it is associated with the REST API's stage
    [association] = synthesized.resources("AWS::WAFv2::WebACLAssociation").values()
    assert association["Properties"]["WebACLArn"] == {"Fn::GetAtt": [acl_id, "Arn"]}
    assert "/stages/" in json.dumps(association["Properties"]["ResourceArn"])


def test_a_waf_limit_under_wafs_minimum_is_refused(synth_variant):
    with pytest.raises(ValueError, match="at least 10"):
        synth_variant(waf_requests_per_5_min_per_ip=5)


def test_the_websocket_routes_may_count_a_tenants_connections_and_the_push_may_read_keys(synthesized):
    # GIVEN the WebSocket functions WHEN their grants are read THEN $connect may query the connection tenant index (the
    # per-tenant cap) and the push function may read the tenants' keys (to close a revoked key's connections)
    template = synthesized.template
    routes = role_actions(template, function_role(template, "lambdas.websocket.handler.lambda_handler"))
    push = role_actions(template, function_role(template, "lambdas.push.handler.lambda_handler"))
    assert settings.CONNECTION_TENANT_INDEX_NAME in json.dumps(routes["dynamodb:Query"])
    [keys] = push["apigateway:GET"]
    assert json.dumps(keys).endswith('"::/apikeys"]]}')
