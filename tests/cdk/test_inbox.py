"""The inbox (issue 20): the template of a stack with inbox rules."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App

from app import props_from_context
from async_inference import config, settings
from tests.cdk.helpers import role_actions

MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
RULES = [
    {"prefix": "docs/", "tenant": "demo", "model": MODEL},
    {"prefix": "nightly/", "tenant": "demo", "model": MODEL, "webhook_url": "https://hooks.example.com/done"},
]
HANDLER = "lambdas.inbox.handler.lambda_handler"


@pytest.fixture(scope="module")
def with_rules(synth_variant):
    return synth_variant(inbox_rules=json.dumps(RULES))


def test_each_rule_is_an_object_created_notification_on_its_prefix_to_the_events_in_function(with_rules):
    """GIVEN two rules WHEN synthesized THEN the bucket notifies the inbox function of objects created under
    inbox/<prefix> of each, beside the upload notification; the function carries the rules."""
    [notifications] = with_rules.resources("Custom::S3BucketNotifications").values()
    lambdas = notifications["Properties"]["NotificationConfiguration"]["LambdaFunctionConfigurations"]
    prefixes = {
        rule["Value"]: json.dumps(entry["LambdaFunctionArn"])
        for entry in lambdas
        for rule in entry["Filter"]["Key"]["FilterRules"]
        if rule["Name"] == "prefix"
    }
    # (files/: the upload function's notification of Files API uploads, tests/cdk/test_storage_and_messaging.py)
    assert set(prefixes) == {settings.UPLOAD_PREFIX, settings.FILE_PREFIX, "inbox/docs/", "inbox/nightly/"}
    [(function_id, function)] = with_rules.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": HANDLER}}
    ).items()
    assert function_id in prefixes["inbox/docs/"] and function_id in prefixes["inbox/nightly/"]
    assert all(entry["Events"] == ["s3:ObjectCreated:*"] for entry in lambdas)
    env = with_rules.variables(function_id)
    assert [rule["prefix"] for rule in json.loads(env[config.ENV_INBOX_RULES])] == ["docs/", "nightly/"]
    assert config.ENV_MODEL_FLEETS in env and config.ENV_WORKER_CLUSTER in env


def test_the_events_in_function_reads_the_inbox_and_queues_but_reads_no_other_payload(with_rules):
    """GIVEN the inbox function's role WHEN reading its S3 and SQS grants THEN it reads objects under inbox/ (and
    its own markers and files), writes bodies, markers and files, and sends to the job queue, lane and control."""
    function = next(
        f for f in with_rules.resources("AWS::Lambda::Function").values() if f["Properties"]["Handler"] == HANDLER
    )
    actions = role_actions(with_rules.template, function["Properties"]["Role"]["Fn::GetAtt"][0])
    read = {json.dumps(r)[-40:] for r in actions["s3:GetObject"]}
    assert any(f"/{settings.INBOX_PREFIX}*" in r for r in read)
    assert not any(settings.RESULT_PREFIX in r or settings.UPLOAD_PREFIX in r for r in read)
    service = with_rules.stack.service
    sent = {r["Fn::GetAtt"][0] for r in actions["sqs:SendMessage"]}
    wanted = (service.fleets[0].jobs.queue, service.fleets[0].lane_queue, service.batches.control_queue)
    assert {with_rules.logical_id(q) for q in wanted} <= sent


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"prefix": "docs/", "tenant": "nobody", "model": MODEL}], "tenant 'nobody'"),
        ([{"prefix": "docs/", "tenant": "demo", "model": "org/other"}], "model 'org/other'"),
        (
            [
                {"prefix": "docs/", "tenant": "demo", "model": MODEL},
                {"prefix": "docs/a/", "tenant": "demo", "model": MODEL},
            ],  # noqa: E501
            "overlaps",
        ),
    ],
)
def test_rules_that_cannot_be_deployed_are_refused_naming_the_problem(rules, message):
    """GIVEN inbox rules naming an unknown tenant or model, or overlapping prefixes WHEN the app reads them THEN a
    ValueError names the rule and what to fix."""
    app = App(context={"inbox_rules": json.dumps(rules)})
    with pytest.raises(ValueError, match="inbox_rules") as raised:
        props_from_context(app)
    assert message in str(raised.value)
