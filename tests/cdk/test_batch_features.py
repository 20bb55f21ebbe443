"""Batch features in the template: jobs with priority "batch" (the API and upload functions reach the batch lane),
batch webhooks (the dispatcher reads batch records), and the batch lane's DLQ (the DLQ handler consumes it)."""

from __future__ import annotations

import pytest

from async_inference import config
from tests.cdk.helpers import function_role, role_actions

pytestmark = pytest.mark.cdk

API = "lambdas.api.handler.lambda_handler"
UPLOAD = "lambdas.upload.handler.lambda_handler"


def _variables(synthesized, handler):
    [function] = synthesized.template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}}).values()
    return function["Properties"]["Environment"]["Variables"]


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_know_the_batch_lane(synthesized, handler):
    """GIVEN the API and upload functions WHEN reading their environment THEN they name the batch-lane queue, where a
    job with priority "batch" is queued."""
    lane = synthesized.logical_id(synthesized.stack.service.batches.lane_queue)
    assert _variables(synthesized, handler)[config.ENV_BATCH_QUEUE_URL] == {"Ref": lane}


@pytest.mark.parametrize("handler", [API, UPLOAD])
def test_the_functions_that_queue_jobs_may_send_to_the_batch_lane(synthesized, handler):
    """GIVEN the API and upload functions WHEN reading their roles THEN each may SendMessage to the batch lane."""
    lane = synthesized.logical_id(synthesized.stack.service.batches.lane_queue)
    sends = role_actions(synthesized.template, function_role(synthesized.template, handler))["sqs:SendMessage"]
    assert {"Fn::GetAtt": [lane, "Arn"]} in sends
