"""The job event log: its table, who may write and read it, and how the workers and the API find it."""

from __future__ import annotations

import pytest

from async_inference import config
from async_inference.streaming import log
from tests.cdk.helpers import function_role, role_actions

pytestmark = pytest.mark.cdk

API = "lambdas.api.handler.lambda_handler"


def _streams(synthesized) -> str:
    return synthesized.logical_id(synthesized.stack.service.streams.table)


def test_the_log_table_is_keyed_by_job_and_sequence_and_expires_its_segments(synthesized):
    """GIVEN the service WHEN synthesized THEN the log is an on-demand, encrypted table keyed (job_id, seq) with a TTL,
    the key names being the ones async_inference.streaming.log writes."""
    table = synthesized.resources("AWS::DynamoDB::Table")[_streams(synthesized)]["Properties"]
    assert table["KeySchema"] == [
        {"AttributeName": log.PARTITION_KEY, "KeyType": "HASH"},
        {"AttributeName": log.SORT_KEY, "KeyType": "RANGE"},
    ]
    assert {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]} == {
        log.PARTITION_KEY: "S",
        log.SORT_KEY: "N",
    }
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["TimeToLiveSpecification"] == {"AttributeName": log.TTL_ATTRIBUTE, "Enabled": True}
    assert table["SSESpecification"] == {"SSEEnabled": True}


def test_the_worker_and_the_api_find_the_log_by_its_variable(synthesized):
    """GIVEN the worker container and the API function WHEN reading their environments THEN both name the log."""
    reference = {"Ref": _streams(synthesized)}
    assert synthesized.worker_environment()[config.ENV_STREAM_TABLE] == reference
    [api] = synthesized.template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": API}}).values()
    assert api["Properties"]["Environment"]["Variables"][config.ENV_STREAM_TABLE] == reference


def test_the_worker_only_appends_to_the_log_and_the_api_only_queries_it(synthesized):
    """GIVEN the roles WHEN reading their grants on the log THEN the worker has PutItem alone, the API Query alone."""
    arn = {"Fn::GetAtt": [_streams(synthesized), "Arn"]}
    worker = role_actions(
        synthesized.template,
        synthesized.logical_id(synthesized.stack.service.fleets[0].workers.task_definition.task_role),
    )
    api = role_actions(synthesized.template, function_role(synthesized.template, API))
    assert {a for a, resources in worker.items() if arn in resources} == {"dynamodb:PutItem"}
    assert {a for a, resources in api.items() if arn in resources} == {"dynamodb:Query"}
