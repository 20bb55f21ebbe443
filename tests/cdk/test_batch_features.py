"""Batch features in the template: jobs with priority "batch" (the API and upload functions reach the batch lane),
batch webhooks (the dispatcher reads batch records), and the batch lane's DLQ (the DLQ handler consumes it)."""

from __future__ import annotations

import pytest

from async_inference import config, settings
from tests.cdk.helpers import function_role, role_actions

pytestmark = pytest.mark.cdk

API = "lambdas.api.handler.lambda_handler"
UPLOAD = "lambdas.upload.handler.lambda_handler"


def _variables(synthesized, handler):
    return synthesized.variables(handler)


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_know_the_batch_lane(synthesized, handler):
    """GIVEN the API and upload functions WHEN reading their environment THEN the model's route names its batch-lane
    queue, where a job with priority "batch" is queued."""
    lane = synthesized.logical_id(synthesized.stack.service.fleets[0].lane_queue)
    parts = _variables(synthesized, handler)[config.ENV_MODEL_FLEETS]["Fn::Join"][1]
    assert any(
        str(before).endswith('"batch_queue_url":"') and part == {"Ref": lane}
        for before, part in zip(parts, parts[1:], strict=False)
    )


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_may_send_to_the_batch_lane(synthesized, handler):
    """GIVEN the API and upload functions WHEN reading their roles THEN each may SendMessage to the batch lane."""
    lane = synthesized.logical_id(synthesized.stack.service.fleets[0].lane_queue)
    sends = role_actions(synthesized.template, function_role(synthesized.template, handler))["sqs:SendMessage"]
    assert {"Fn::GetAtt": [lane, "Arn"]} in sends


DLQ = "lambdas.dlq.handler.lambda_handler"


def _function_id(synthesized, handler):
    [logical_id] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).keys()
    return logical_id


def test_the_dlq_handler_consumes_the_batch_lanes_dlq_with_partial_failures(synthesized):
    """GIVEN the batch lane's DLQ WHEN reading the event source mappings THEN the DLQ handler consumes it, reporting
    failures per item (a message it cannot process stays for an operator)."""
    lane_dlq = synthesized.logical_id(synthesized.stack.service.fleets[0].lane_dead_letter_queue)
    synthesized.template.has_resource_properties(
        "AWS::Lambda::EventSourceMapping",
        {
            "EventSourceArn": {"Fn::GetAtt": [lane_dlq, "Arn"]},
            "FunctionName": {"Ref": _function_id(synthesized, DLQ)},
            "FunctionResponseTypes": ["ReportBatchItemFailures"],
        },
    )


def test_the_dlq_handler_knows_the_batch_table_and_the_control_queue(synthesized):
    """GIVEN the DLQ handler WHEN reading its environment THEN it names the batch table (the chunk's count) and the
    control queue (the finalize step of the batch's last chunk)."""
    batches = synthesized.stack.service.batches
    variables = _variables(synthesized, DLQ)
    assert variables[config.ENV_BATCH_TABLE] == {"Ref": synthesized.logical_id(batches.table)}
    assert variables[config.ENV_BATCH_CONTROL_QUEUE_URL] == {"Ref": synthesized.logical_id(batches.control_queue)}


def test_the_dlq_handler_writes_batch_parts_only_and_sends_only_finalize_steps(synthesized):
    """GIVEN the DLQ handler's role WHEN reading its writes THEN it puts objects under the batch parts prefix only,
    and sends only to the control queue."""
    actions = role_actions(synthesized.template, function_role(synthesized.template, DLQ))
    assert [r["Fn::Join"][1][-1].lstrip("/") for r in actions["s3:PutObject"]] == [f"{settings.BATCH_PREFIX}*"]
    control = synthesized.logical_id(synthesized.stack.service.batches.control_queue)
    assert actions["sqs:SendMessage"] == [{"Fn::GetAtt": [control, "Arn"]}]


WEBHOOKS = "lambdas.webhooks.handler.lambda_handler"


def test_the_webhook_dispatcher_reads_and_records_batch_webhooks_in_the_batch_table(synthesized):
    """GIVEN the webhook dispatcher WHEN reading its environment and role THEN it names the batch table and may get
    and update its items (a batch's webhook and its attempts), nothing more there."""
    table = synthesized.logical_id(synthesized.stack.service.batches.table)
    assert _variables(synthesized, WEBHOOKS)[config.ENV_BATCH_TABLE] == {"Ref": table}
    actions = role_actions(synthesized.template, function_role(synthesized.template, WEBHOOKS))
    on_table = {name for name, resources in actions.items() if {"Fn::GetAtt": [table, "Arn"]} in resources}
    assert on_table == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
