"""GPU capacity, the worker task and queue-driven scaling to and from zero."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

pytestmark = pytest.mark.cdk


def test_no_launch_configuration_is_emitted(synthesized):
    """GIVEN cdk.json's feature flags WHEN synthesized THEN the ASG uses a launch template, not a configuration."""
    synthesized.template.resource_count_is("AWS::AutoScaling::LaunchConfiguration", 0)
    synthesized.template.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup", {"LaunchTemplate": Match.object_like({"Version": Match.any_value()})}
    )


def test_launch_template_uses_the_gpu_instance_type_and_the_ecs_gpu_ami(synthesized):
    """GIVEN the default instance type WHEN reading the launch template THEN it is g5.xlarge on the ECS GPU AMI."""
    synthesized.template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {"LaunchTemplateData": Match.object_like({"InstanceType": "g5.xlarge"})},
    )
    parameters = synthesized.template.find_parameters("*", {"Default": Match.string_like_regexp("gpu/recommended")})
    assert any("/ecs/optimized-ami/amazon-linux-2023/gpu/" in p["Default"] for p in parameters.values())


def test_gpu_instances_can_scale_to_zero(synthesized):
    """GIVEN the GPU Auto Scaling group WHEN idle THEN nothing forces an instance to run."""
    synthesized.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"MinSize": "0"})


def test_capacity_provider_has_managed_scaling_and_termination_protection(synthesized):
    """GIVEN the capacity provider WHEN reading it THEN ECS manages scaling and protects busy instances."""
    synthesized.template.has_resource_properties(
        "AWS::ECS::CapacityProvider",
        {
            "AutoScalingGroupProvider": Match.object_like(
                {
                    "ManagedScaling": Match.object_like({"Status": "ENABLED", "TargetCapacity": 100}),
                    "ManagedTerminationProtection": "ENABLED",
                }
            )
        },
    )


def test_worker_container_requires_one_gpu(synthesized):
    """GIVEN the worker task definition WHEN reading the container THEN it reserves one GPU."""
    synthesized.template.has_resource_properties(
        "AWS::ECS::TaskDefinition",
        {
            "RequiresCompatibilities": ["EC2"],
            "ContainerDefinitions": [
                Match.object_like({"ResourceRequirements": [{"Type": "GPU", "Value": "1"}], "StopTimeout": 120})
            ],
        },
    )


def test_worker_gets_the_runtime_configuration_and_model(synthesized):
    """GIVEN the worker container WHEN reading its environment THEN queue, table, engine and model are set."""
    [definition] = synthesized.resources("AWS::ECS::TaskDefinition").values()
    names = {e["Name"]: e["Value"] for e in definition["Properties"]["ContainerDefinitions"][0]["Environment"]}
    assert {"JOBS_QUEUE_URL", "JOBS_TABLE_NAME", "JOBS_BUCKET_NAME", "RESULT_TOPIC_ARN", "MAX_NUM_SEQS"} <= set(names)
    assert names["ENGINE"] == "vllm"
    assert names["MODEL"] == "Qwen/Qwen2.5-1.5B-Instruct"


def test_service_runs_on_the_capacity_provider_with_the_circuit_breaker(synthesized):
    """GIVEN the worker service WHEN reading it THEN it uses the GPU capacity provider and rolls back bad deploys."""
    [provider] = synthesized.resources("AWS::ECS::CapacityProvider")
    synthesized.template.has_resource_properties(
        "AWS::ECS::Service",
        {
            "CapacityProviderStrategy": [{"CapacityProvider": {"Ref": provider}, "Weight": 1}],
            "DeploymentConfiguration": Match.object_like(
                {"DeploymentCircuitBreaker": {"Enable": True, "Rollback": True}}
            ),
            "DesiredCount": 0,
        },
    )


def test_task_count_scales_between_zero_and_the_maximum(synthesized):
    """GIVEN the scalable target WHEN reading its bounds THEN the minimum is 0 tasks."""
    synthesized.template.has_resource_properties(
        "AWS::ApplicationAutoScaling::ScalableTarget",
        {"MinCapacity": 0, "MaxCapacity": 2, "ScalableDimension": "ecs:service:DesiredCount"},
    )


def _alarm_policy(synthesized, alarm):
    [action] = synthesized.json["Resources"][synthesized.logical_id(alarm)]["Properties"]["AlarmActions"]
    return synthesized.json["Resources"][action["Ref"]]["Properties"]


def test_first_visible_message_scales_out_from_zero(synthesized):
    """GIVEN an idle service WHEN one message is visible for a minute THEN a step adds one task."""
    alarm = synthesized.stack.service.scaling.scale_out_alarm
    synthesized.template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "ApproximateNumberOfMessagesVisible",
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1,
            "EvaluationPeriods": 1,
        },
    )
    policy = _alarm_policy(synthesized, alarm)["StepScalingPolicyConfiguration"]
    assert policy["AdjustmentType"] == "ChangeInCapacity"
    first = policy["StepAdjustments"][0]
    assert first["MetricIntervalLowerBound"] == 0 and first["ScalingAdjustment"] == 1


def test_scale_out_adds_more_tasks_as_the_backlog_grows(synthesized):
    """GIVEN the scale-out steps WHEN the backlog crosses each threshold THEN more tasks are added, never fewer."""
    policy = _alarm_policy(synthesized, synthesized.stack.service.scaling.scale_out_alarm)
    steps = policy["StepScalingPolicyConfiguration"]["StepAdjustments"]
    adjustments = [s["ScalingAdjustment"] for s in sorted(steps, key=lambda s: s["MetricIntervalLowerBound"])]
    assert adjustments == sorted(adjustments) and len(adjustments) >= 2 and min(adjustments) > 0


def test_scale_in_to_zero_waits_for_no_visible_and_no_in_flight_message(synthesized):
    """GIVEN the scale-in alarm WHEN a job is visible or in flight THEN it cannot fire (it sums both, <= 0)."""
    alarm = synthesized.stack.service.scaling.scale_in_alarm
    properties = synthesized.json["Resources"][synthesized.logical_id(alarm)]["Properties"]
    assert properties["ComparisonOperator"] == "LessThanOrEqualToThreshold" and properties["Threshold"] == 0
    expression = next(m["Expression"] for m in properties["Metrics"] if "Expression" in m)
    metric_names = {m["MetricStat"]["Metric"]["MetricName"] for m in properties["Metrics"] if "MetricStat" in m}
    assert expression == "visible + inFlight"
    assert metric_names == {"ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible"}
    policy = _alarm_policy(synthesized, alarm)["StepScalingPolicyConfiguration"]
    assert policy["AdjustmentType"] == "ExactCapacity"
    assert [s["ScalingAdjustment"] for s in policy["StepAdjustments"]] == [0]


def test_no_other_policy_removes_tasks(synthesized):
    """GIVEN every scaling policy WHEN listing those that lower the count THEN only the scale-in-to-zero one does."""
    configurations = [
        policy["Properties"]["StepScalingPolicyConfiguration"]
        for policy in synthesized.resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()
    ]
    lowering = [
        c
        for c in configurations
        if c["AdjustmentType"] == "ExactCapacity" or any(s["ScalingAdjustment"] < 0 for s in c["StepAdjustments"])
    ]
    assert len(lowering) == 1
