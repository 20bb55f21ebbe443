"""Operations that reach someone (issue 27, finding 6): every alarm has an action, the stack's topic is named in an
output, and GPU capacity, launch failures, failed tasks, Lambda errors and throttles and API 5xx are watched; every
function logs to a group the stack owns, with retention."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdk.operations_alarms import ALARM_TOPIC_OUTPUT, CAPACITY_SHORT_MINUTES, FAULT_STOP_CODES, METRICS_PER_ALARM

pytestmark = pytest.mark.cdk

GIVEN_TOPIC = "arn:aws:sns:us-east-1:111122223333:ops-alarms"


def _alarms(synthesized) -> dict[str, dict[str, Any]]:
    return {lid: r["Properties"] for lid, r in synthesized.resources("AWS::CloudWatch::Alarm").items()}


def _topic_id(synthesized) -> str:
    return synthesized.json["Outputs"][ALARM_TOPIC_OUTPUT]["Value"]["Ref"]


def _scaling_policies(synthesized) -> set[str]:
    return set(synthesized.resources("AWS::ApplicationAutoScaling::ScalingPolicy"))


def test_every_alarm_has_an_action_and_each_but_the_scaling_ones_notifies_the_stacks_topic(synthesized):
    """GIVEN the default context (no alarm_topic_arn) WHEN synthesized THEN the stack creates an SNS topic named in
    the AlarmTopicArn output, and every alarm acts: the scaling alarms on their scaling policies, every other one
    on that topic (9 of 12 alarms had no action)."""
    topic = _topic_id(synthesized)
    assert synthesized.resources("AWS::SNS::Topic")[topic]
    policies = _scaling_policies(synthesized)
    for logical_id, alarm in _alarms(synthesized).items():
        actions = alarm.get("AlarmActions", [])
        refs = {action.get("Ref") for action in actions if isinstance(action, dict)}
        assert actions, f"{logical_id} has no action"
        assert refs <= policies or refs == {topic}, f"{logical_id} acts on {actions}"


def test_alarms_notify_a_given_topic_and_the_stack_makes_none(synth_variant):
    """GIVEN alarm_topic_arn in context WHEN synthesized THEN every non-scaling alarm notifies that ARN and the stack
    creates no alarm topic and no AlarmTopicArn output."""
    synthesized = synth_variant(alarm_topic_arn=GIVEN_TOPIC)
    assert ALARM_TOPIC_OUTPUT not in synthesized.json.get("Outputs", {})
    policies = _scaling_policies(synthesized)
    for logical_id, alarm in _alarms(synthesized).items():
        refs = {a.get("Ref") for a in alarm["AlarmActions"] if isinstance(a, dict)}
        assert refs <= policies and refs or alarm["AlarmActions"] == [GIVEN_TOPIC], logical_id


def test_an_email_in_context_is_subscribed_to_the_alarm_topic(synth_variant):
    """GIVEN alarm_email in context WHEN synthesized THEN the alarm topic has an email subscription to it."""
    synthesized = synth_variant(alarm_email="oncall@example.com")
    subscriptions = synthesized.template.find_resources(
        "AWS::SNS::Subscription", {"Properties": {"Protocol": "email", "Endpoint": "oncall@example.com"}}
    )
    [subscription] = subscriptions.values()
    assert subscription["Properties"]["TopicArn"] == {"Ref": _topic_id(synthesized)}


def _watched_functions(synthesized, metric_name: str) -> list[str]:
    watched = []
    for alarm in _alarms(synthesized).values():
        for query in alarm.get("Metrics", []):
            stat = query.get("MetricStat", {}).get("Metric", {})
            if stat.get("Namespace") == "AWS/Lambda" and stat.get("MetricName") == metric_name:
                [dimension] = stat["Dimensions"]
                watched.append(dimension["Value"]["Ref"])
    return watched


@pytest.mark.parametrize("metric_name", ["Errors", "Throttles"])
def test_every_function_of_the_stack_is_watched_for_errors_and_throttles(synthesized, metric_name):
    """GIVEN every Lambda function of the template (CDK's own handlers included) WHEN reading the alarms THEN each
    is in exactly one alarm's sum of its ``metric_name``, at most METRICS_PER_ALARM to an alarm."""
    functions = set(synthesized.resources("AWS::Lambda::Function"))
    watched = _watched_functions(synthesized, metric_name)
    assert sorted(watched) == sorted(functions)
    for alarm in _alarms(synthesized).values():
        assert len(alarm.get("Metrics", [])) <= METRICS_PER_ALARM + 1


def test_the_rest_api_is_watched_for_5xx_answers(synthesized):
    """GIVEN the REST API WHEN reading the alarms THEN one alarms on its 5XXError sum above 0."""
    [api] = synthesized.resources("AWS::ApiGateway::RestApi").values()
    found = [
        a
        for a in _alarms(synthesized).values()
        if a.get("MetricName") == "5XXError" and a["Namespace"] == "AWS/ApiGateway"
    ]
    assert len(found) == 1 and found[0]["Threshold"] == 0
    [dimension] = [d for d in found[0]["Dimensions"] if d["Name"] == "ApiName"]
    assert dimension["Value"] == api["Properties"]["Name"]


def test_each_gpu_fleet_alarms_when_its_tasks_wait_for_capacity_that_does_not_come(synth_variant):
    """GIVEN two fleets WHEN synthesized THEN each capacity provider has an alarm on its CapacityProviderReservation
    above 100 (tasks waiting for instances) for CAPACITY_SHORT_MINUTES minutes, saying where to look."""
    from tests.cdk.test_fleet_lifecycle import TWO_MODELS

    synthesized = synth_variant(**TWO_MODELS)
    providers = set(synthesized.resources("AWS::ECS::CapacityProvider"))
    short = [a for a in _alarms(synthesized).values() if a.get("MetricName") == "CapacityProviderReservation"]
    assert len(short) == len(providers) == 2
    assert {
        d["Value"]["Ref"] for a in short for d in a["Dimensions"] if d["Name"] == "CapacityProviderName"
    } == providers
    for alarm in short:
        assert alarm["Threshold"] == 100 and alarm["ComparisonOperator"] == "GreaterThanThreshold"
        assert alarm["EvaluationPeriods"] == CAPACITY_SHORT_MINUTES and alarm["Period"] == 60
        assert "quota" in alarm["AlarmDescription"] and "describe-scaling-activities" in alarm["AlarmDescription"]


def _rules_to_topic(synthesized, detail_type: str) -> list[dict[str, Any]]:
    topic = _topic_id(synthesized)
    rules = []
    for rule in synthesized.resources("AWS::Events::Rule").values():
        pattern = rule["Properties"].get("EventPattern", {})
        if detail_type in pattern.get("detail-type", []):
            assert [t["Arn"] for t in rule["Properties"]["Targets"]] == [{"Ref": topic}]
            rules.append(pattern)
    return rules


def test_each_gpu_groups_failed_launches_reach_the_topic_with_ec2s_reason(synth_variant):
    """GIVEN two fleets WHEN synthesized THEN each group's EC2 Instance Launch Unsuccessful events go to the alarm
    topic (a G quota of 0 says so within the minute, with EC2's message)."""
    from tests.cdk.test_fleet_lifecycle import TWO_MODELS

    synthesized = synth_variant(**TWO_MODELS)
    groups = set(synthesized.resources("AWS::AutoScaling::AutoScalingGroup"))
    patterns = _rules_to_topic(synthesized, "EC2 Instance Launch Unsuccessful")
    assert {p["detail"]["AutoScalingGroupName"][0]["Ref"] for p in patterns} == groups
    topic_policy = json.dumps(synthesized.resources("AWS::SNS::TopicPolicy"))
    assert "events.amazonaws.com" in topic_policy


def test_worker_tasks_that_stop_on_a_fault_reach_the_topic(synthesized):
    """GIVEN the cluster WHEN synthesized THEN a task that stops with a fault's stop code (not a scale-in) is sent to
    the alarm topic."""
    [cluster] = synthesized.resources("AWS::ECS::Cluster")
    [pattern] = _rules_to_topic(synthesized, "ECS Task State Change")
    assert pattern["detail"]["stopCode"] == FAULT_STOP_CODES and pattern["detail"]["lastStatus"] == ["STOPPED"]
    assert pattern["detail"]["clusterArn"] == [{"Fn::GetAtt": [cluster, "Arn"]}]


def test_every_function_logs_to_a_group_the_stack_owns_with_retention(synthesized):
    """GIVEN every Lambda function of the template, CDK's bucket-notifications handler and default-security-group
    provider included (they logged to groups Lambda makes, kept for ever) WHEN reading its LoggingConfig THEN it
    names a log group of the stack that has a retention."""
    groups = synthesized.resources("AWS::Logs::LogGroup")
    for logical_id, function in synthesized.resources("AWS::Lambda::Function").items():
        log_group = function["Properties"].get("LoggingConfig", {}).get("LogGroup")
        assert isinstance(log_group, dict) and "Ref" in log_group, f"{logical_id} logs to {log_group}"
        assert groups[log_group["Ref"]]["Properties"]["RetentionInDays"] > 0, logical_id
