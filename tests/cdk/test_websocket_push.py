"""The WebSocket push: its API, routes and stage, the connection table, the push function, and their permissions."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from async_inference import config, settings
from cdk.options import AsyncInferenceServiceProps
from tests.cdk.helpers import function_role, role_actions, role_statements

pytestmark = pytest.mark.cdk

ROUTES = "lambdas.websocket.handler.lambda_handler"
PUSH = "lambdas.push.handler.lambda_handler"
DELTA_PUSH = "lambdas.push.deltas.lambda_handler"


def _function_id(synthesized, handler):
    [logical_id] = synthesized.template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}})
    return logical_id


def _api_id(synthesized):
    return synthesized.logical_id(synthesized.stack.service.push.api)


def test_the_websocket_api_routes_on_the_messages_action(synthesized):
    """GIVEN the service WHEN synthesized THEN a WebSocket API selects routes by the message's "action"."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGatewayV2::Api", {"ProtocolType": "WEBSOCKET", "RouteSelectionExpression": "$request.body.action"}
    )


@pytest.mark.parametrize("route_key", ["$connect", "$disconnect", "$default", settings.WS_ROUTE_SUBSCRIBE])
def test_each_route_is_integrated_with_the_routes_function(synthesized, route_key):
    """GIVEN a route of the protocol WHEN reading it THEN it is a Lambda proxy integration of the routes function."""
    [route] = synthesized.template.find_resources(
        "AWS::ApiGatewayV2::Route", {"Properties": {"RouteKey": route_key}}
    ).values()
    integration_id = route["Properties"]["Target"]["Fn::Join"][1][1]["Ref"]
    integration = synthesized.resources("AWS::ApiGatewayV2::Integration")[integration_id]["Properties"]
    assert integration["IntegrationType"] == "AWS_PROXY"
    assert _function_id(synthesized, ROUTES) in str(integration["IntegrationUri"])


@pytest.mark.parametrize("route_key", ["$default", settings.WS_ROUTE_SUBSCRIBE])
def test_subscribe_and_default_answer_the_client(synthesized, route_key):
    """GIVEN the routes a client sends messages to WHEN reading them THEN each has a route response, so the function's
    reply (subscribed, or what to fix) reaches the client."""
    routes = synthesized.template.find_resources("AWS::ApiGatewayV2::Route", {"Properties": {"RouteKey": route_key}})
    [route_id] = routes
    assert routes[route_id]["Properties"]["RouteResponseSelectionExpression"] == "$default"
    synthesized.template.has_resource_properties(
        "AWS::ApiGatewayV2::RouteResponse", {"RouteId": {"Ref": route_id}, "RouteResponseKey": "$default"}
    )


def test_connect_authenticates_with_the_tenants_api_keys(synthesized):
    """GIVEN $connect WHEN reading the routes function THEN it knows every tenant key's id and may read the key
    collection (GetApiKeys, and no other API Gateway resource) to tell a key's tenant."""
    keys = synthesized.resources("AWS::ApiGateway::ApiKey")
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": ROUTES}}
    ).values()
    ids = synthesized.variables(ROUTES)[config.ENV_TENANT_API_KEY_IDS]
    assert {part["Ref"] for part in ids["Fn::Join"][1] if isinstance(part, dict)} == set(keys)
    gets = role_actions(synthesized.template, function_role(synthesized.template, ROUTES))["apigateway:GET"]
    assert [resource["Fn::Join"][1][-1] for resource in gets] == ["::/apikeys"]  # GetApiKeys, one call for all


def test_the_connection_table_expires_connections_and_lists_them_per_tenant(synthesized):
    """GIVEN the connection table WHEN reading it THEN items expire by TTL and a tenant index serves the push."""
    table = synthesized.logical_id(synthesized.stack.service.push.connections)
    synthesized.template.has_resource(
        "AWS::DynamoDB::Table",
        {
            "Properties": Match.object_like(
                {
                    "KeySchema": [{"AttributeName": settings.CONNECTION_TABLE_PARTITION_KEY, "KeyType": "HASH"}],
                    "TimeToLiveSpecification": {"AttributeName": settings.CONNECTION_TTL_ATTRIBUTE, "Enabled": True},
                    "GlobalSecondaryIndexes": [
                        Match.object_like(
                            {
                                "IndexName": settings.CONNECTION_TENANT_INDEX_NAME,
                                "KeySchema": [{"AttributeName": settings.CONNECTION_TENANT_KEY, "KeyType": "HASH"}],
                            }
                        )
                    ],
                    "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                }
            ),
        },
    )
    assert table in synthesized.resources("AWS::DynamoDB::Table")


def test_the_push_function_sees_only_final_job_and_batch_events_of_the_result_topic(synthesized):
    """GIVEN the result topic WHEN reading the push function's subscription THEN it filters on the event attribute:
    a job's end and a batch's end."""
    topic = synthesized.logical_id(synthesized.stack.service.results.topic)
    synthesized.template.has_resource_properties(
        "AWS::SNS::Subscription",
        {
            "Protocol": "lambda",
            "TopicArn": {"Ref": topic},
            "Endpoint": {"Fn::GetAtt": [_function_id(synthesized, PUSH), "Arn"]},
            "FilterPolicy": {settings.EVENT_ATTRIBUTE: [settings.RESULT_EVENT, *settings.BATCH_RESULT_EVENTS]},
        },
    )


def test_the_push_function_hears_started_and_progress_on_the_job_event_topic(synthesized):
    """GIVEN the job event topic WHEN reading its subscriptions THEN the push function gets started and progress."""
    topic = synthesized.logical_id(synthesized.stack.service.push.events_topic)
    synthesized.template.has_resource_properties(
        "AWS::SNS::Subscription",
        {
            "Protocol": "lambda",
            "TopicArn": {"Ref": topic},
            "Endpoint": {"Fn::GetAtt": [_function_id(synthesized, PUSH), "Arn"]},
            "FilterPolicy": {settings.EVENT_ATTRIBUTE: list(settings.ACTIVITY_EVENTS)},
        },
    )


def test_the_job_event_topic_is_encrypted_and_tls_only(synthesized):
    """GIVEN the job event topic WHEN reading it THEN it uses the result topic's key and refuses plain HTTP."""
    service = synthesized.stack.service
    topic = synthesized.resources("AWS::SNS::Topic")[synthesized.logical_id(service.push.events_topic)]
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [synthesized.logical_id(service.results.key), "Arn"]}
    policies = [
        p
        for p in synthesized.resources("AWS::SNS::TopicPolicy").values()
        if {"Ref": synthesized.logical_id(service.push.events_topic)} in p["Properties"]["Topics"]
    ]
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        for p in policies
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    )


def test_manage_connections_is_the_push_functions_on_this_stage_only(synthesized):
    """GIVEN the push function WHEN reading its role THEN execute-api:ManageConnections names this API's stage's
    connections and nothing else."""
    statements = [
        s
        for s in role_statements(synthesized.template, function_role(synthesized.template, PUSH))
        if s["Action"] == "execute-api:ManageConnections"
    ]
    [statement] = statements
    parts = statement["Resource"]["Fn::Join"][1]
    assert {"Ref": _api_id(synthesized)} in parts
    assert parts[-1] == f"/{synthesized.stack.service.push.stage.stage_name}/*/@connections/*"


def test_no_other_role_may_manage_connections(synthesized):
    """GIVEN every role WHEN reading its policies THEN only the push functions' (job events, deltas) grant
    ManageConnections."""
    pushers = {function_role(synthesized.template, handler) for handler in (PUSH, DELTA_PUSH)}
    roles = synthesized.resources("AWS::IAM::Role")
    holders = {role for role in roles if "execute-api:ManageConnections" in role_actions(synthesized.template, role)}
    assert holders == pushers and len(pushers) == 2


def test_the_push_function_reads_the_tenant_index_and_deletes_gone_connections(synthesized):
    """GIVEN the push function WHEN reading its role THEN it may query the tenant index and delete items, no more."""
    table = synthesized.logical_id(synthesized.stack.service.push.connections)
    actions = role_actions(synthesized.template, function_role(synthesized.template, PUSH))
    dynamo = {name for name in actions if name.startswith("dynamodb:")}
    assert dynamo == {"dynamodb:Query", "dynamodb:DeleteItem"}
    assert settings.CONNECTION_TENANT_INDEX_NAME in str(actions["dynamodb:Query"])
    assert actions["dynamodb:DeleteItem"] == [{"Fn::GetAtt": [table, "Arn"]}]


def test_the_push_function_posts_to_the_stages_callback_url(synthesized):
    """GIVEN the push function WHEN reading its environment THEN the management endpoint is the stage's URL."""
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": PUSH}}
    ).values()
    url = function["Properties"]["Environment"]["Variables"][config.ENV_WEBSOCKET_CALLBACK_URL]
    assert url["Fn::Join"][1][0] == "https://" and {"Ref": _api_id(synthesized)} in url["Fn::Join"][1]


def test_stale_events_are_not_retried_for_long(synthesized):
    """GIVEN the push function WHEN reading its asynchronous invocation config THEN an event is dropped after 5
    minutes: a client that missed it reads the job at its next check."""
    synthesized.template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {
            "FunctionName": {"Ref": _function_id(synthesized, PUSH)},
            "MaximumEventAgeInSeconds": 300,
            "MaximumRetryAttempts": 2,
        },
    )


def test_the_stage_logs_access_and_is_throttled(synthesized):
    """GIVEN the WebSocket stage WHEN reading it THEN it deploys itself, logs access and throttles messages."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGatewayV2::Stage",
        {
            "ApiId": {"Ref": _api_id(synthesized)},
            "AutoDeploy": True,
            "AccessLogSettings": Match.object_like({"DestinationArn": Match.any_value()}),
            "DefaultRouteSettings": {"ThrottlingRateLimit": 100, "ThrottlingBurstLimit": 200},
        },
    )


def test_the_worker_publishes_job_events_and_knows_the_progress_interval(synthesized):
    """GIVEN the worker WHEN reading its task THEN it has the job event topic, the progress interval, and may publish
    to that topic."""
    topic = synthesized.logical_id(synthesized.stack.service.push.events_topic)
    environment = synthesized.worker_environment()
    assert environment[config.ENV_JOB_EVENTS_TOPIC_ARN] == {"Ref": topic}
    assert environment[config.ENV_PROGRESS_INTERVAL_S] == str(int(settings.PROGRESS_INTERVAL_S))
    task_role = synthesized.logical_id(synthesized.stack.service.fleets[0].workers.task_definition.task_role)
    assert {"Ref": topic} in role_actions(synthesized.template, task_role)["sns:Publish"]


def test_without_websocket_push_there_is_no_websocket_api_and_no_job_events(synth_variant):
    """GIVEN websocket_push false WHEN synthesized THEN no WebSocket API, no job event topic, and the worker publishes
    no job events (its progress interval still applies to the job's progress)."""
    variant = synth_variant(websocket_push="false")
    variant.template.resource_count_is("AWS::ApiGatewayV2::Api", 0)
    assert variant.stack.service.push is None
    assert config.ENV_JOB_EVENTS_TOPIC_ARN not in variant.worker_environment()
    assert config.ENV_PROGRESS_INTERVAL_S in variant.worker_environment()


def test_a_negative_progress_interval_is_refused():
    """GIVEN progress_interval_s below 0 WHEN validating THEN the error names it."""
    with pytest.raises(ValueError, match="progress_interval_s"):
        AsyncInferenceServiceProps(progress_interval_s=-1).validate()


# --- Streamed jobs' text: the job event log's stream, pushed as job.delta ----------------------------------------------


def _delta_mapping(synthesized):
    [mapping] = synthesized.template.find_resources(
        "AWS::Lambda::EventSourceMapping",
        {"Properties": {"FunctionName": {"Ref": _function_id(synthesized, DELTA_PUSH)}}},
    ).values()
    return mapping["Properties"]


def test_the_delta_push_function_reads_the_event_logs_stream_from_its_latest_record(synthesized):
    """GIVEN the job event log WHEN reading the delta push function's event source THEN it is the log table's stream
    of new images, read from the latest record (a delta is worth pushing while its job decodes), in batches of 100."""
    log_table = synthesized.logical_id(synthesized.stack.service.streams.table)
    synthesized.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": Match.array_with([{"AttributeName": "seq", "KeyType": "RANGE"}]),
            "StreamSpecification": {"StreamViewType": "NEW_IMAGE"},
        },
    )
    mapping = _delta_mapping(synthesized)
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [log_table, "StreamArn"]}
    assert mapping["StartingPosition"] == "LATEST" and mapping["BatchSize"] == 100


def test_only_written_segments_that_name_their_tenant_invoke_the_delta_push(synthesized):
    """GIVEN the log's stream WHEN reading the mapping's filter THEN only inserted items with a tenant pass: the TTL's
    deletions invoke nothing, and an item nobody can be told about is not delivered."""
    [only] = _delta_mapping(synthesized)["FilterCriteria"]["Filters"]
    assert json.loads(only["Pattern"]) == {
        "eventName": ["INSERT"],
        "dynamodb": {"NewImage": {"tenant": {"S": [{"exists": True}]}}},
    }


def test_a_stale_or_failing_delta_batch_is_not_retried_for_long(synthesized):
    """GIVEN the mapping WHEN a batch keeps failing THEN it is retried twice and a record a minute old is dropped: the
    shard is not held up behind it, and a client that missed a delta resumes from the log."""
    mapping = _delta_mapping(synthesized)
    assert mapping["MaximumRetryAttempts"] == 2 and mapping["MaximumRecordAgeInSeconds"] == 60


def test_the_delta_push_function_reads_the_stream_and_pushes_as_the_push_function_does(synthesized):
    """GIVEN the delta push function WHEN reading its role THEN it may read the log's stream (not the table), query the
    connections' tenant index and delete gone connections, and manage this stage's connections, no more."""
    log_table = synthesized.logical_id(synthesized.stack.service.streams.table)
    actions = role_actions(synthesized.template, function_role(synthesized.template, DELTA_PUSH))
    dynamo = {name for name in actions if name.startswith("dynamodb:")}
    assert dynamo == {
        "dynamodb:DescribeStream",
        "dynamodb:GetRecords",
        "dynamodb:GetShardIterator",
        "dynamodb:ListStreams",
        "dynamodb:Query",
        "dynamodb:DeleteItem",
    }
    assert actions["dynamodb:GetRecords"] == [{"Fn::GetAtt": [log_table, "StreamArn"]}]
    assert settings.CONNECTION_TENANT_INDEX_NAME in str(actions["dynamodb:Query"])
    assert "execute-api:ManageConnections" in actions


def test_the_delta_push_function_posts_to_the_stages_callback_url(synthesized):
    """GIVEN the delta push function WHEN reading its environment THEN it has the push function's: the stage's
    management URL, the connection table, the tenant keys (from the deployment's catalog)."""
    functions = {handler: synthesized.variables(handler) for handler in (PUSH, DELTA_PUSH)}  # the catalog's included
    for name in (config.ENV_WEBSOCKET_CALLBACK_URL, config.ENV_CONNECTIONS_TABLE, config.ENV_TENANT_API_KEY_IDS):
        assert functions[DELTA_PUSH][name] == functions[PUSH][name]


def test_the_routes_function_may_only_query_the_event_log_to_resume_deltas(synthesized):
    """GIVEN a subscription with starting_after WHEN reading the routes function THEN it finds the log by its variable
    and may Query it (the deltas since), and no other call on it."""
    log_table = synthesized.logical_id(synthesized.stack.service.streams.table)
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": ROUTES}}
    ).values()
    assert function["Properties"]["Environment"]["Variables"][config.ENV_STREAM_TABLE] == {"Ref": log_table}
    actions = role_actions(synthesized.template, function_role(synthesized.template, ROUTES))
    on_log = {name for name, resources in actions.items() if {"Fn::GetAtt": [log_table, "Arn"]} in resources}
    assert on_log == {"dynamodb:Query"}
