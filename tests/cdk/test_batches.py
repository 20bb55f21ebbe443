"""Batches in the template: the batch table, the batch lane, the control queue and the controller, the authorizer,
multipart uploads, the served model, and the least privilege of the controller (the API's and the worker's batch
grants are checked with their other grants in test_api_and_permissions.py)."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from async_inference import config, settings
from cdk.batches import CONTROL_MAX_RECEIVE_COUNT
from tests.cdk.helpers import function_role, role_actions, role_statements

pytestmark = pytest.mark.cdk

CONTROLLER = "lambdas.batch_controller.handler.lambda_handler"
API = "lambdas.api.handler.lambda_handler"
AUTHORIZER = "lambdas.authorizer.handler.lambda_handler"
XRAY = {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}
PUBLISH = {"sns:Publish", "kms:GenerateDataKey", "kms:Decrypt"}
EVENT_SOURCE = {
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueUrl",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
}


def _prefixes(resources):
    return {r["Fn::Join"][1][-1].lstrip("/") for r in resources if isinstance(r, dict) and "Fn::Join" in r}


def _function(synthesized, handler):
    [function] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).values()
    return function


def test_the_batch_table_is_keyed_listed_per_owner_and_expires(synthesized):
    """GIVEN the batch table WHEN reading it THEN its key, owner index and TTL are the names the store writes, and it is
    on-demand, encrypted and point-in-time recoverable."""
    synthesized.template.has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": settings.BATCH_TABLE_PARTITION_KEY, "KeyType": "HASH"}],
            "BillingMode": "PAY_PER_REQUEST",
            "SSESpecification": {"SSEEnabled": True},
            "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
            "TimeToLiveSpecification": {"AttributeName": settings.BATCH_TTL_ATTRIBUTE, "Enabled": True},
            "GlobalSecondaryIndexes": [
                Match.object_like(
                    {
                        "IndexName": settings.BATCH_OWNER_INDEX_NAME,
                        "KeySchema": [
                            {"AttributeName": settings.BATCH_OWNER_ATTRIBUTE, "KeyType": "HASH"},
                            {"AttributeName": settings.BATCH_CREATED_KEY_ATTRIBUTE, "KeyType": "RANGE"},
                        ],
                    }
                ),
                Match.object_like({"IndexName": settings.BATCH_ACTIVE_INDEX_NAME}),  # tests/cdk/test_security.py
            ],
        },
    )


def test_the_batch_lane_redrives_to_its_dlq_with_the_job_queues_timings(synthesized):
    """GIVEN the batch-lane queue WHEN reading it THEN workers hold chunks as they hold jobs (visibility extended each
    heartbeat), and a chunk that keeps failing moves to its own DLQ after MAX_RECEIVE_COUNT receives."""
    service = synthesized.stack.service
    dlq = synthesized.logical_id(service.fleets[0].lane_dead_letter_queue)
    [lane] = [
        r
        for lid, r in synthesized.resources("AWS::SQS::Queue").items()
        if lid == synthesized.logical_id(service.fleets[0].lane_queue)
    ]
    assert lane["Properties"]["VisibilityTimeout"] == settings.VISIBILITY_TIMEOUT_S
    assert lane["Properties"]["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]},
        "maxReceiveCount": settings.MAX_RECEIVE_COUNT,
    }
    assert lane["Properties"]["SqsManagedSseEnabled"] is True


def test_the_controller_takes_one_control_step_at_a_time_with_partial_failures(synthesized):
    """GIVEN the controller's event source WHEN reading it THEN it consumes the control queue one message at a time
    and reports failures per item, and the control queue redrives after CONTROL_MAX_RECEIVE_COUNT receives."""
    service = synthesized.stack.service
    control = synthesized.logical_id(service.batches.control_queue)
    synthesized.template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Fn::GetAtt": [control, "Arn"]},
            "BatchSize": 1,
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
        },
    )
    queue = synthesized.json["Resources"][control]["Properties"]
    assert queue["RedrivePolicy"]["maxReceiveCount"] == CONTROL_MAX_RECEIVE_COUNT
    assert queue["VisibilityTimeout"] >= 6 * _function(synthesized, CONTROLLER)["Properties"]["Timeout"]


@pytest.mark.parametrize("dlq", ["lane_dead_letter_queue", "control_dead_letter_queue"])
def test_each_batch_dlq_is_alarmed(synthesized, dlq):
    """GIVEN a batch DLQ WHEN reading the alarms THEN one fires when it holds a message."""
    owner = synthesized.stack.service.fleets[0] if dlq.startswith("lane") else synthesized.stack.service.batches
    queue = synthesized.logical_id(getattr(owner, dlq))
    alarms = [a for a in synthesized.resources("AWS::CloudWatch::Alarm").values() if queue in json.dumps(a)]
    assert alarms and alarms[0]["Properties"]["MetricName"] == "ApproximateNumberOfMessagesVisible"


@pytest.mark.parametrize("handler", [API, CONTROLLER])
def test_api_and_controller_get_the_batch_resources_and_the_served_model(synthesized, handler):
    """GIVEN the API and the controller WHEN reading their environment THEN they name the batch table, the control
    queue, the routes (each model's lane) and the served model (cdk.json's ``model``) that requests are checked
    against."""
    variables = synthesized.variables(handler)
    assert {config.ENV_BATCH_TABLE, config.ENV_MODEL_FLEETS, config.ENV_BATCH_CONTROL_QUEUE_URL} <= set(variables)
    assert json.loads(variables[config.ENV_SERVED_MODELS]) == [
        synthesized.stack.node.try_get_context("model") or "Qwen/Qwen2.5-1.5B-Instruct"
    ]


def test_the_worker_gets_the_batch_lane_and_the_control_queue(synthesized):
    environment = synthesized.worker_environment()
    assert {config.ENV_BATCH_TABLE, config.ENV_BATCH_QUEUE_URL, config.ENV_BATCH_CONTROL_QUEUE_URL} <= set(environment)


def test_the_controller_role_has_exactly_the_calls_the_controller_makes(synthesized):
    """GIVEN the controller's role WHEN listing its actions THEN it reads and writes batch items, queries the index of
    batches in flight (max_batch_lines_in_flight), reads inputs and parts, writes (and may abort or delete) output
    files, sends chunks and wakes the workers, notifies; no DeleteItem, no Scan."""
    actions = role_actions(synthesized.template, function_role(synthesized.template, CONTROLLER))
    assert set(actions) == {
        "dynamodb:GetItem",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "s3:GetObject",
        "s3:ListBucket",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "sqs:SendMessage",
        *PUBLISH,
        *EVENT_SOURCE,
        *XRAY,
        "ssm:GetParametersByPath",  # its parts of the deployment's catalog (cdk.catalog)
        "ecs:DescribeServices",
        "ecs:UpdateService",
        # the wake's hold of the scaling minimum (tests/cdk/test_scaling_hazards.py)
        "application-autoscaling:RegisterScalableTarget",
        "application-autoscaling:PutScheduledAction",
        # the wake's instance start (tests/cdk/test_api_and_permissions.py)
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:SetDesiredCapacity",
    }
    assert _prefixes(actions["s3:GetObject"]) == {f"{settings.FILE_PREFIX}*", f"{settings.BATCH_PREFIX}*"}
    assert _prefixes(actions["s3:PutObject"]) == _prefixes(actions["s3:DeleteObject"]) == {f"{settings.FILE_PREFIX}*"}
    lane = synthesized.logical_id(synthesized.stack.service.fleets[0].lane_queue)
    assert actions["sqs:SendMessage"] == [{"Fn::GetAtt": [lane, "Arn"]}]
    table = synthesized.logical_id(synthesized.stack.service.batches.table)
    assert actions["dynamodb:UpdateItem"] == [{"Fn::GetAtt": [table, "Arn"]}]
    index = f"/index/{settings.BATCH_ACTIVE_INDEX_NAME}"
    assert actions["dynamodb:Query"] == [{"Fn::Join": ["", [{"Fn::GetAtt": [table, "Arn"]}, index]]}]


def test_the_controller_lists_only_the_prefixes_it_reads(synthesized):
    role = function_role(synthesized.template, CONTROLLER)
    [statement] = [s for s in role_statements(synthesized.template, role) if s["Action"] == "s3:ListBucket"]
    assert statement["Condition"] == {
        "StringLike": {"s3:prefix": [f"{settings.FILE_PREFIX}*", f"{settings.BATCH_PREFIX}*"]}
    }


def test_the_authorizer_is_not_cached_by_the_gateway_and_needs_no_identity_source(synthesized):
    """GIVEN the REQUEST authorizer WHEN reading it THEN API Gateway caches nothing (TTL 0) and lists no identity
    source: with caching on, a request missing any listed source is refused with 401 before the authorizer runs, and a
    request carries either Authorization or x-api-key."""
    [authorizer] = synthesized.resources("AWS::ApiGateway::Authorizer").values()
    assert authorizer["Properties"]["Type"] == "REQUEST"
    assert authorizer["Properties"]["AuthorizerResultTtlInSeconds"] == 0
    assert "IdentitySource" not in authorizer["Properties"]


def test_the_authorizer_knows_this_stacks_keys_by_id(synthesized):
    """GIVEN the tenants' API keys WHEN reading the authorizer's environment THEN it maps each tenant to its key's id."""
    variables = synthesized.variables(AUTHORIZER)
    rendered = json.dumps(variables[config.ENV_TENANT_API_KEY_IDS])
    for key in synthesized.resources("AWS::ApiGateway::ApiKey"):
        assert key in rendered
    assert '\\"demo\\"' in rendered and '\\"acme\\"' in rendered


def test_a_missing_or_unknown_key_is_a_401_that_says_how_to_send_one(synthesized):
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::GatewayResponse",
        {
            "ResponseType": "UNAUTHORIZED",
            "ResponseTemplates": {"application/json": Match.string_like_regexp(r'"code": "invalid_api_key".*Bearer')},
        },
    )


def test_multipart_bodies_reach_the_function_as_binary(synthesized):
    """GIVEN POST /v1/files (multipart, possibly binary) WHEN reading the REST API THEN multipart/form-data is a binary
    media type, written with CloudFormation's ~1 for the slash."""
    synthesized.template.has_resource_properties(
        "AWS::ApiGateway::RestApi", {"BinaryMediaTypes": ["multipart~1form-data"]}
    )


@pytest.mark.parametrize("prefix", [settings.FILE_PREFIX, settings.BATCH_PREFIX])
def test_files_and_parts_expire_with_their_records(synthesized, prefix):
    synthesized.template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        Match.object_like(
                            {"Prefix": prefix, "ExpirationInDays": settings.FILE_RETENTION_DAYS, "Status": "Enabled"}
                        )
                    ]
                )
            }
        },
    )


def test_the_stack_outputs_the_batch_resources(synthesized):
    for output in ("BatchTableName", "BatchQueueUrl", "BatchControlQueueUrl"):
        synthesized.template.has_output(output, {"Value": Match.any_value()})


def test_scaling_counts_the_batch_lane_by_its_lines(synthesized):
    """GIVEN the batch lane WHEN reading the scale-out alarm THEN its backlog sums the job queue and the batch-lane
    queue, a chunk weighing its BATCH_CHUNK_LINES lines."""
    lane = synthesized.logical_id(synthesized.stack.service.fleets[0].lane_queue)
    alarms = [a for a in synthesized.resources("AWS::CloudWatch::Alarm").values() if lane in json.dumps(a)]
    assert alarms, "no alarm reads the batch lane"
    expressions = " ".join(m.get("Expression", "") for a in alarms for m in a["Properties"].get("Metrics", []))
    assert str(settings.BATCH_CHUNK_LINES) in expressions
