"""EventBridge events for job and batch state changes (issue 20): the template with eventbridge_events."""

from __future__ import annotations

import json

from async_inference import config, settings
from tests.cdk.helpers import role_actions

HANDLER = "lambdas.state_events.handler.lambda_handler"


def _function(synthesized):
    return {
        lid: f
        for lid, f in synthesized.resources("AWS::Lambda::Function").items()
        if f["Properties"]["Handler"] == HANDLER
    }


def test_the_state_events_function_hears_every_state_change_and_may_put_on_the_default_bus_only(synth_variant):
    """GIVEN eventbridge_events WHEN synthesized THEN the function is subscribed to the result topic for job and batch
    ends and to the job event topic for starts, and may PutEvents on the default bus and nothing else."""
    variant = synth_variant(eventbridge_events="true")
    [(function_id, function)] = _function(variant).items()
    assert function["Properties"]["Environment"]["Variables"][config.ENV_EVENT_BUS_NAME] == "default"
    service = variant.stack.service
    topics = {
        variant.logical_id(service.results.topic): [settings.RESULT_EVENT, *settings.BATCH_RESULT_EVENTS],
        variant.logical_id(service.push.events_topic): ["job.started"],
    }
    found = {}
    for subscription in variant.resources("AWS::SNS::Subscription").values():
        props = subscription["Properties"]
        if props["Protocol"] == "lambda" and function_id in json.dumps(props["Endpoint"]):
            found[props["TopicArn"]["Ref"]] = props["FilterPolicy"][settings.EVENT_ATTRIBUTE]
    assert found == topics
    actions = role_actions(variant.template, function["Properties"]["Role"]["Fn::GetAtt"][0])
    [bus] = actions["events:PutEvents"]
    assert json.dumps(bus).endswith(':event-bus/default"]]}')
    assert not [a for a in actions if a.startswith(("s3:", "dynamodb:", "sqs:SendMessage"))]


def test_without_eventbridge_events_there_is_no_state_events_function(synthesized):
    """GIVEN the default options WHEN synthesized THEN no function puts events (the option is off by default)."""
    assert _function(synthesized) == {}
