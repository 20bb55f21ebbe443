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
        },
    )


def test_service_template_sets_no_desired_count(synthesized):
    """GIVEN CloudFormation re-applies a template's DesiredCount on every service update WHEN reading the worker
    service THEN it has none, so a deploy of new worker code keeps the running fleet that scaling set."""
    [service] = synthesized.resources("AWS::ECS::Service").values()
    assert "DesiredCount" not in service["Properties"]


def _deployment_can_place_at_full_load(variant, gpus_per_instance=1):
    """Whether a deployment while every task runs can place its new tasks: either old tasks may stop first
    (minimum healthy below 100% of the task maximum) or the group has a GPU beyond the most tasks."""
    [service] = variant.resources("AWS::ECS::Service").values()
    [target] = variant.resources("AWS::ApplicationAutoScaling::ScalableTarget").values()
    [group] = variant.resources("AWS::AutoScaling::AutoScalingGroup").values()
    tasks = target["Properties"]["MaxCapacity"]
    deployment = service["Properties"]["DeploymentConfiguration"]
    # ECS rounds the minimum up: the running tasks it must keep while it deploys at full load.
    kept = -(-tasks * deployment["MinimumHealthyPercent"] // 100)
    gpus = int(group["Properties"]["MaxSize"]) * gpus_per_instance
    return kept < tasks or gpus > tasks


def test_default_deployment_stops_an_old_task_before_it_starts_the_new_one(synthesized):
    """GIVEN as many GPU instances as worker tasks (cdk.json) WHEN a deployment runs at full load THEN it stops an
    old task first (0% minimum healthy, 100% maximum), so each new task gets the GPU its predecessor frees."""
    synthesized.template.has_resource_properties(
        "AWS::ECS::Service",
        {
            "DeploymentConfiguration": Match.object_like({"MinimumHealthyPercent": 0, "MaximumPercent": 100}),
            "AvailabilityZoneRebalancing": "DISABLED",
        },
    )
    assert _deployment_can_place_at_full_load(synthesized)


def test_a_spare_instance_lets_deployments_start_new_tasks_first(synth_variant):
    """GIVEN deployment_spare_instances=1 and a third instance beyond two tasks WHEN synthesized THEN deployments
    start before they stop (100% / 200%) and the group may grow to the spare instance."""
    variant = synth_variant(max_gpu_instances=3, max_worker_tasks=2, deployment_spare_instances=1)
    variant.template.has_resource_properties(
        "AWS::ECS::Service",
        {"DeploymentConfiguration": Match.object_like({"MinimumHealthyPercent": 100, "MaximumPercent": 200})},
    )
    variant.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"MaxSize": "3"})
    assert _deployment_can_place_at_full_load(variant)


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
