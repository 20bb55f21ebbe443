"""GPU capacity, the worker task and queue-driven scaling to and from zero."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Match

from async_inference import settings
from tests.cdk.helpers import role_actions

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


def test_service_template_sets_no_literal_desired_count(synthesized):
    """GIVEN CloudFormation re-applies a template's DesiredCount on every service update WHEN reading the worker
    service THEN its DesiredCount is no literal but its Custom::WorkerDesiredCount's attribute (0 at create, the
    service's own count after: tests/cdk/test_fleet_lifecycle.py), so a deploy of new worker code keeps the running
    fleet that scaling set."""
    [service] = synthesized.resources("AWS::ECS::Service").values()
    count_id, _ = service["Properties"]["DesiredCount"]["Fn::GetAtt"]
    assert synthesized.json["Resources"][count_id]["Type"] == "Custom::WorkerDesiredCount"


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


def _alarm(synthesized, alarm):
    return synthesized.json["Resources"][synthesized.logical_id(alarm)]["Properties"]


def _alarm_policy(synthesized, alarm):
    [action] = _alarm(synthesized, alarm)["AlarmActions"]
    return synthesized.json["Resources"][action["Ref"]]["Properties"]


def _expression(properties):
    [expression] = [m["Expression"] for m in properties["Metrics"] if m.get("ReturnData")]
    return expression


def _stats(properties):
    """metric id -> (namespace, name, statistic, period) of an alarm's metric math inputs."""
    return {
        m["Id"]: (
            m["MetricStat"]["Metric"]["Namespace"],
            m["MetricStat"]["Metric"]["MetricName"],
            m["MetricStat"]["Stat"],
            m["MetricStat"]["Period"],
        )
        for m in properties["Metrics"]
        if "MetricStat" in m
    }


# Two queues count: the job queue (1) and the batch lane (2), whose messages are chunks of BATCH_CHUNK_LINES lines.
SQS_BACKLOG = {
    f"{name}{index}": ("AWS/SQS", metric, "Maximum", 60)
    for index in (1, 2)
    for name, metric in (
        ("visible", "ApproximateNumberOfMessagesVisible"),
        ("inFlight", "ApproximateNumberOfMessagesNotVisible"),
    )
}
# Each term FILLed: an idle lane's metrics pause (SQS stops publishing them), which must not blank the sum.
BACKLOG = (
    f"FILL(visible1, 0) + FILL(inFlight1, 0) + {settings.BATCH_CHUNK_LINES} * (FILL(visible2, 0) + FILL(inFlight2, 0))"
)
DESIRED = {"desired": ("ECS/ContainerInsights", "DesiredTaskCount", "Maximum", 60)}
# The sized batch (135 for Qwen2.5-1.5B on a g5.xlarge): cdk.service's default jobs_per_task.
JOBS_PER_TASK = 135


def test_scale_out_alarm_reads_the_tasks_the_backlog_needs_when_more_than_wanted(synthesized):
    """GIVEN the scale-out alarm WHEN reading it THEN its metric is n = CEIL(backlog / J) when n exceeds the desired
    count (tasks still starting included) by one or more, else 0; it breaches at 1, on one minute of data, missing
    data not breaching."""
    properties = _alarm(synthesized, synthesized.stack.service.fleets[0].scaling.scale_out_alarm)
    needed = f"CEIL(({BACKLOG}) / {JOBS_PER_TASK:g})"
    assert _expression(properties) == f"IF({needed} - FILL(desired, 0) >= 1, {needed}, 0)"
    assert _stats(properties) == {**SQS_BACKLOG, **DESIRED}
    assert (properties["ComparisonOperator"], properties["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
    assert (properties["EvaluationPeriods"], properties["DatapointsToAlarm"]) == (1, 1)
    assert properties["TreatMissingData"] == "notBreaching"


def test_scale_out_sets_the_tasks_needed_one_step_per_count_with_a_one_minute_cooldown(synthesized):
    """GIVEN the scale-out policy WHEN k tasks needed breach THEN it sets the count to k (ExactCapacity; bounds
    relative to the threshold 1), up to the task maximum, after a 60 s cooldown: setting, not adding, so a desired
    count Container Insights has not published yet (read as 0) cannot ask for a task twice."""
    policy = _alarm_policy(synthesized, synthesized.stack.service.fleets[0].scaling.scale_out_alarm)
    config = policy["StepScalingPolicyConfiguration"]
    assert (config["AdjustmentType"], config["MetricAggregationType"], config["Cooldown"]) == (
        "ExactCapacity",
        "Maximum",
        60,
    )
    assert config["StepAdjustments"] == [
        {"MetricIntervalLowerBound": 0, "MetricIntervalUpperBound": 1, "ScalingAdjustment": 1},
        {"MetricIntervalLowerBound": 1, "ScalingAdjustment": 2},
    ]


def test_the_desired_count_is_container_insights_of_this_service(synthesized):
    """GIVEN the scaling alarms WHEN reading DesiredTaskCount's dimensions THEN they name this cluster and service,
    and the cluster publishes Container Insights."""
    workers = synthesized.stack.service.fleets[0].workers
    properties = _alarm(synthesized, synthesized.stack.service.fleets[0].scaling.scale_out_alarm)
    [desired] = [m for m in properties["Metrics"] if m["Id"] == "desired"]
    assert desired["MetricStat"]["Metric"]["Dimensions"] == [
        {"Name": "ClusterName", "Value": {"Ref": synthesized.logical_id(workers.cluster)}},
        {"Name": "ServiceName", "Value": {"Fn::GetAtt": [synthesized.logical_id(workers.service), "Name"]}},
    ]
    synthesized.template.has_resource_properties(
        "AWS::ECS::Cluster", {"ClusterSettings": [{"Name": "containerInsights", "Value": "enabled"}]}
    )


def test_step_down_removes_one_task_after_three_minutes_of_capacity_spare_at_half_fill(synthesized):
    """GIVEN the step-down alarm WHEN reading it THEN it breaches when the desired count exceeds the tasks the backlog
    needs at half of J (never fewer than one) for 3 of 3 minutes, and removes one task, 120 s apart."""
    alarm = synthesized.stack.service.fleets[0].scaling.scale_in_alarm
    properties = _alarm(synthesized, alarm)
    half = JOBS_PER_TASK / 2
    assert _expression(properties) == (f"FILL(desired, 0) - IF(({BACKLOG}) > 0, CEIL(({BACKLOG}) / {half:g}), 1)")
    assert _stats(properties) == {**SQS_BACKLOG, **DESIRED}
    assert (properties["ComparisonOperator"], properties["Threshold"]) == ("GreaterThanOrEqualToThreshold", 1)
    assert (properties["EvaluationPeriods"], properties["DatapointsToAlarm"], properties["TreatMissingData"]) == (
        3,
        3,
        "missing",
    )
    config = _alarm_policy(synthesized, alarm)["StepScalingPolicyConfiguration"]
    assert (config["AdjustmentType"], config["Cooldown"]) == ("ChangeInCapacity", 120)
    assert config["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": -1}]


def test_keep_alive_scales_to_zero_after_minutes_with_nothing_visible_in_flight_or_sent(synthesized):
    """GIVEN the keep-alive alarm WHEN a message is visible, in flight or was sent in a minute THEN that minute does
    not breach, nor while the learned keep-alive keeps the last task; 3 published idle minutes set the count to
    exactly 0, and a minute any queue did not publish (no FILL: missing, not breaching) never counts as idle."""
    alarm = synthesized.stack.service.fleets[0].scaling.idle_alarm
    properties = _alarm(synthesized, alarm)
    assert _expression(properties) == (
        " + ".join(f"{m}{i}" for i in (1, 2) for m in ("visible", "inFlight", "sent")) + " + FILL(keepWarm, 0)"
    )
    assert _stats(properties) == {
        **SQS_BACKLOG,
        **{f"sent{i}": ("AWS/SQS", "NumberOfMessagesSent", "Sum", 60) for i in (1, 2)},
        "keepWarm": ("AsyncInference", "KeepWarm", "Maximum", 60),
    }
    assert (properties["ComparisonOperator"], properties["Threshold"]) == ("LessThanOrEqualToThreshold", 0)
    assert (properties["EvaluationPeriods"], properties["DatapointsToAlarm"], properties["TreatMissingData"]) == (
        3,
        3,
        "notBreaching",
    )
    config = _alarm_policy(synthesized, alarm)["StepScalingPolicyConfiguration"]
    assert config["AdjustmentType"] == "ExactCapacity"
    assert config["StepAdjustments"] == [{"MetricIntervalUpperBound": 0, "ScalingAdjustment": 0}]


def test_only_the_step_down_and_the_keep_alive_remove_tasks(synthesized):
    """GIVEN every scaling policy WHEN listing those that lower the count THEN one removes a task, one sets zero."""
    lowering = sorted(
        (c["AdjustmentType"], [s["ScalingAdjustment"] for s in c["StepAdjustments"]])
        for c in (
            p["Properties"]["StepScalingPolicyConfiguration"]
            for p in synthesized.resources("AWS::ApplicationAutoScaling::ScalingPolicy").values()
        )
        if any(s["ScalingAdjustment"] < 0 for s in c["StepAdjustments"])
        or (c["AdjustmentType"] == "ExactCapacity" and any(s["ScalingAdjustment"] == 0 for s in c["StepAdjustments"]))
    )
    assert lowering == [("ChangeInCapacity", [-1]), ("ExactCapacity", [0])]


def test_scaling_thresholds_follow_their_options(synth_variant):
    """GIVEN jobs_per_task, the step-down's fill and minutes, the keep-alive and the cooldowns set WHEN synthesized
    THEN each alarm and policy carries them."""
    variant = synth_variant(
        max_num_seqs=16,
        jobs_per_task=40,
        scale_in_fill=0.75,
        scale_in_minutes=5,
        idle_minutes_before_scale_in=7,
        scale_out_cooldown_seconds=90,
        scale_in_cooldown_seconds=300,
        max_worker_tasks=3,
        max_gpu_instances=3,
    )
    scaling = variant.stack.service.fleets[0].scaling
    short, spare, idle = (
        _alarm(variant, a) for a in (scaling.scale_out_alarm, scaling.scale_in_alarm, scaling.idle_alarm)
    )
    assert "/ 40)" in _expression(short) and "/ 30)" in _expression(spare)
    assert (spare["EvaluationPeriods"], idle["EvaluationPeriods"]) == (5, 7)
    out = _alarm_policy(variant, scaling.scale_out_alarm)["StepScalingPolicyConfiguration"]
    assert out["Cooldown"] == 90 and [s["ScalingAdjustment"] for s in out["StepAdjustments"]] == [1, 2, 3]
    assert _alarm_policy(variant, scaling.scale_in_alarm)["StepScalingPolicyConfiguration"]["Cooldown"] == 300
    assert variant.worker_environment()["MAX_NUM_SEQS"] == "16"


def test_the_default_batch_is_the_sizing_rule(synthesized):
    """GIVEN no max_num_seqs in cdk.json WHEN reading the worker's environment THEN it runs cdk.capacity's 135."""
    assert synthesized.worker_environment()["MAX_NUM_SEQS"] == "135"


def test_capacity_provider_instance_warmup_is_a_gpu_instances_boot(synthesized):
    """GIVEN managed scaling WHEN reading the capacity provider THEN a second instance may launch 120 s after the
    first, not ECS's default 300 s."""
    synthesized.template.has_resource_properties(
        "AWS::ECS::CapacityProvider",
        {
            "AutoScalingGroupProvider": Match.object_like(
                {"ManagedScaling": Match.object_like({"InstanceWarmupPeriod": 120})}
            )
        },
    )


def test_worker_task_definition_marks_its_task_protection_mode(synthesized):
    """GIVEN the default worker WHEN reading its environment THEN it holds protection for long jobs only, at the
    expected 20 tokens a second, and its role may set the protection."""
    env = synthesized.worker_environment()
    assert (env["TASK_PROTECTION"], env["TASK_PROTECTION_TOKENS_PER_S"]) == ("long_jobs", "20")
    [task] = synthesized.resources("AWS::ECS::TaskDefinition").values()
    actions = role_actions(synthesized.template, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    assert {"ecs:UpdateTaskProtection", "ecs:GetTaskProtection"} <= set(actions)


def test_task_protection_off_marks_the_task_and_grants_no_protection(synth_variant):
    variant = synth_variant(worker_task_protection="off")
    assert variant.worker_environment()["TASK_PROTECTION"] == "off"
    [task] = variant.resources("AWS::ECS::TaskDefinition").values()
    actions = role_actions(variant.template, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    assert not [a for a in actions if "TaskProtection" in a]


def test_queue_scaling_sums_the_weighted_backlog_of_every_counted_queue():
    """GIVEN QueueScaling over the job queue and a second queue whose messages count half a job WHEN synthesized THEN
    the scale-out and step-down read the weighted sum, and the keep-alive watches every queue's messages and sends."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_ecs as ecs
    from aws_cdk import aws_sqs as sqs
    from aws_cdk.assertions import Template

    from cdk.queue_scaling import CountedQueue, QueueScaling

    stack = Stack(App(), "Two")
    cluster = ecs.Cluster(stack, "Cluster")
    cluster.add_capacity("Capacity", instance_type=ec2.InstanceType("t3.micro"))
    task = ecs.Ec2TaskDefinition(stack, "Task")
    task.add_container("c", image=ecs.ContainerImage.from_registry("worker"), memory_reservation_mib=256)
    service = ecs.Ec2Service(stack, "Service", cluster=cluster, task_definition=task)
    jobs, lane = sqs.Queue(stack, "Jobs"), sqs.Queue(stack, "Lane")
    scaling = QueueScaling(
        stack,
        "Scaling",
        service=service,
        queues=[jobs, CountedQueue(lane, weight=0.5)],
        jobs_per_task=24,
        learned_keep_alive=False,
    )
    resources = Template.from_stack(stack).to_json()["Resources"]

    def props(alarm):
        return resources[stack.get_logical_id(alarm.node.default_child)]["Properties"]

    backlog = "(FILL(visible1, 0) + FILL(inFlight1, 0) + 0.5 * (FILL(visible2, 0) + FILL(inFlight2, 0)))"
    assert _expression(props(scaling.scale_out_alarm)) == (
        f"IF(CEIL({backlog} / 24) - FILL(desired, 0) >= 1, CEIL({backlog} / 24), 0)"
    )
    assert backlog in _expression(props(scaling.scale_in_alarm))
    idle = props(scaling.idle_alarm)
    assert _expression(idle) == " + ".join(f"{m}{i}" for i in (1, 2) for m in ("visible", "inFlight", "sent"))
    queues = {
        m["Id"]: m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]["Fn::GetAtt"][0]
        for m in idle["Metrics"]
        if "MetricStat" in m
    }
    jobs_id, lane_id = (stack.get_logical_id(q.node.default_child) for q in (jobs, lane))
    assert queues == {
        "visible1": jobs_id,
        "inFlight1": jobs_id,
        "sent1": jobs_id,
        "visible2": lane_id,
        "inFlight2": lane_id,
        "sent2": lane_id,
    }
