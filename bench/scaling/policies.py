"""The policies compared, each as the resources that would deploy it, read back through ``template.read_policy``.

* ``deployed``: the synthesized stack's own template (cdk/queue_scaling.py), never re-typed.
* ``queue_processing``: aws-cdk-lib's ``QueueProcessingEc2Service`` with its defaults, synthesized here: step scaling
  on ApproximateNumberOfMessagesVisible ({upper 0: -1}, {lower 100: +1}, {lower 500: +5}, the construct's
  ``defaultScalingSteps``) plus target tracking on CPU at 50 %; minimum 1 (its ``minScalingCapacity`` default).
* ``sagemaker``: SageMaker Asynchronous Inference's documented policy ("Autoscale an asynchronous endpoint", SageMaker
  Developer Guide): target tracking on ApproximateBacklogSizePerInstance (target 5, Average) plus the
  ``HasBacklogWithoutCapacity-ScalingPolicy`` step (+1, Cooldown 300, its alarm 2 of 2 one-minute datapoints >= 1,
  TreatMissingData missing). In ECS terms the backlog is visible plus in-flight messages and the instances are the
  running tasks.
* ``keda``: deploy/eks/scaledobject.yaml, through ``keda.read_scaled_object``.
* ``candidate``: see ``candidate_resources``.

Every policy gets the same fleet ceiling (``max_tasks``) and runs on the same capacity layer (the stack's Auto Scaling
group under ECS managed scaling), so they differ only in how they set the task count.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.scaling.figures import INSTANCE_BOOT_S
from bench.scaling.simulation import ApiWake, Scenario
from bench.scaling.template import read_policy

ECS_TARGET = {"ScalableDimension": "ecs:service:DesiredCount", "ServiceNamespace": "ecs"}
CDK_JSON = Path(__file__).resolve().parents[2] / "cdk.json"


def _metric(id_: str, namespace: str, name: str, stat: str = "Maximum", period: int = 60) -> dict[str, Any]:
    return {"Id": id_, "MetricStat": {"Metric": {"Namespace": namespace, "MetricName": name}, "Stat": stat,
                                      "Period": period}, "ReturnData": False}


def _sqs(stat: str = "Maximum") -> list[dict[str, Any]]:
    return [_metric("visible", "AWS/SQS", "ApproximateNumberOfMessagesVisible", stat),
            _metric("inFlight", "AWS/SQS", "ApproximateNumberOfMessagesNotVisible", stat)]


def _target(maximum: int, minimum: int = 0) -> dict[str, Any]:
    return {"Type": "AWS::ApplicationAutoScaling::ScalableTarget",
            "Properties": {"MinCapacity": minimum, "MaxCapacity": maximum, **ECS_TARGET}}


def sagemaker_resources(max_tasks: int) -> dict[str, Any]:
    backlog_per_instance = {
        "Metrics": [*_sqs("Average"), _metric("instances", "ECS/ContainerInsights", "RunningTaskCount", "Average"),
                    {"Id": "e1", "Expression": "(visible + inFlight) / instances", "ReturnData": True}]
    }
    return {"Resources": {
        "Target": _target(max_tasks),
        "BacklogTracking": {
            "Type": "AWS::ApplicationAutoScaling::ScalingPolicy",
            "Properties": {
                "PolicyType": "TargetTrackingScaling",
                "ScalingTargetId": {"Ref": "Target"},
                "TargetTrackingScalingPolicyConfiguration": {
                    "TargetValue": 5.0,
                    "CustomizedMetricSpecification": backlog_per_instance,
                },
            },
        },
        "HasBacklogWithoutCapacityScalingPolicy": {
            "Type": "AWS::ApplicationAutoScaling::ScalingPolicy",
            "Properties": {
                "PolicyType": "StepScaling",
                "ScalingTargetId": {"Ref": "Target"},
                "StepScalingPolicyConfiguration": {
                    "AdjustmentType": "ChangeInCapacity",
                    "MetricAggregationType": "Average",
                    "Cooldown": 300,
                    "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
                },
            },
        },
        "HasBacklogWithoutCapacityAlarm": {
            "Type": "AWS::CloudWatch::Alarm",
            "Properties": {
                "Metrics": [*_sqs("Average"),
                            _metric("instances", "ECS/ContainerInsights", "RunningTaskCount", "Average"),
                            {"Id": "e1", "Expression": "IF(instances == 0 AND (visible + inFlight) > 0, 1, 0)",
                             "ReturnData": True}],
                "Threshold": 1,
                "ComparisonOperator": "GreaterThanOrEqualToThreshold",
                "EvaluationPeriods": 2,
                "DatapointsToAlarm": 2,
                "TreatMissingData": "missing",
                "AlarmActions": [{"Ref": "HasBacklogWithoutCapacityScalingPolicy"}],
            },
        },
    }}


# The candidate's tuning, chosen by simulating the conversation trace (docs/scaling.md shows the neighbours):
# a task's batch plus half a batch queued before another task is added; scale in when the backlog would fit in one task
# fewer at half that fill for 3 minutes; scale to zero after 3 minutes without a message.
JOBS_PER_TASK_OVER_BATCH = 1.5
SCALE_IN_FILL = 0.5
SCALE_IN_MINUTES = 3
KEEP_ALIVE_MINUTES = 3
# The capacity provider's InstanceWarmupPeriod for the candidate: the modelled instance boot (figures.INSTANCE_BOOT_S),
# which is what the warm-up guards (the agent registering); ECS's 300 s default keeps a second instance from launching
# for 5 minutes after the first.
CANDIDATE_INSTANCE_WARMUP_S = INSTANCE_BOOT_S


def candidate_resources(
    max_tasks: int,
    jobs_per_task: float,
    *,
    scale_in_fill: float = SCALE_IN_FILL,
    scale_in_minutes: int = SCALE_IN_MINUTES,
    keep_alive_minutes: int = KEEP_ALIVE_MINUTES,
) -> dict[str, Any]:
    """The candidate's CloudWatch alarms and step policies, as phase 2 is to synthesize them.

    * ``TasksShort``: tasks needed minus tasks desired, where tasks needed = CEIL((visible + in flight) /
      jobs_per_task) and desired is Container Insights' DesiredTaskCount, so tasks still starting count. One one-minute
      datapoint >= 1 invokes ``ScaleOut``: ChangeInCapacity by the shortfall (a step per task), Cooldown 60 s.
    * ``TasksSpare``: desired minus MAX(CEIL(backlog / (jobs_per_task x scale_in_fill)), 1) >= 1 for
      ``scale_in_minutes`` datapoints invokes ``ScaleIn``: -1, Cooldown 120 s. It steps down, never below one task.
    * ``Idle``: visible + in flight + NumberOfMessagesSent (Sum) <= 0 for ``keep_alive_minutes`` datapoints, missing
      data breaching (an idle queue publishes none), invokes ``ScaleToZero``: ExactCapacity 0. Any message sent in a
      minute breaks the run, so the keep-alive restarts with each message.
    """
    needed = f"CEIL((visible + inFlight) / {jobs_per_task:g})"
    spare = f"MAX(CEIL((visible + inFlight) / {jobs_per_task * scale_in_fill:g}), 1)"
    desired = _metric("desired", "ECS/ContainerInsights", "DesiredTaskCount")

    def policy(config: dict[str, Any]) -> dict[str, Any]:
        return {"Type": "AWS::ApplicationAutoScaling::ScalingPolicy",
                "Properties": {"PolicyType": "StepScaling", "ScalingTargetId": {"Ref": "Target"},
                               "StepScalingPolicyConfiguration": config}}

    def alarm(metrics: list[dict[str, Any]], threshold: float, comparison: str, periods: int, missing: str,
              action: str) -> dict[str, Any]:
        return {"Type": "AWS::CloudWatch::Alarm",
                "Properties": {"Metrics": metrics, "Threshold": threshold, "ComparisonOperator": comparison,
                               "EvaluationPeriods": periods, "DatapointsToAlarm": periods,
                               "TreatMissingData": missing, "AlarmActions": [{"Ref": action}]}}

    out_steps = [{"MetricIntervalLowerBound": k, "MetricIntervalUpperBound": k + 1, "ScalingAdjustment": k + 1}
                 for k in range(max(1, max_tasks) - 1)]
    out_steps.append({"MetricIntervalLowerBound": max(1, max_tasks) - 1, "ScalingAdjustment": max(1, max_tasks)})
    return {"Resources": {
        "Target": _target(max_tasks),
        "ScaleOut": policy({"AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum", "Cooldown": 60,
                            "StepAdjustments": out_steps}),
        "ScaleIn": policy({"AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Minimum", "Cooldown": 120,
                           "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": -1}]}),
        "ScaleToZero": policy({"AdjustmentType": "ExactCapacity", "MetricAggregationType": "Maximum",
                               "StepAdjustments": [{"MetricIntervalUpperBound": 0, "ScalingAdjustment": 0}]}),
        "TasksShort": alarm([*_sqs(), desired, {"Id": "e1", "Expression": f"{needed} - desired", "ReturnData": True}],
                            1, "GreaterThanOrEqualToThreshold", 1, "notBreaching", "ScaleOut"),
        "TasksSpare": alarm([*_sqs(), desired, {"Id": "e1", "Expression": f"desired - {spare}", "ReturnData": True}],
                            1, "GreaterThanOrEqualToThreshold", scale_in_minutes, "missing", "ScaleIn"),
        "Idle": alarm([*_sqs(), _metric("sent", "AWS/SQS", "NumberOfMessagesSent", "Sum"),
                       {"Id": "e1", "Expression": "visible + inFlight + sent", "ReturnData": True}],
                      0, "LessThanOrEqualToThreshold", keep_alive_minutes, "breaching", "ScaleToZero"),
    }}


def queue_processing_template(max_tasks: int, cpu_units: int) -> dict[str, Any]:
    """aws-cdk-lib's QueueProcessingEc2Service with its scaling defaults, synthesized (max raised to the common
    ceiling; the container reserves the instance's CPU so that CPUUtilization has a denominator)."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_ecs as ecs
    from aws_cdk import aws_ecs_patterns as patterns
    from aws_cdk.assertions import Template

    context = json.loads(CDK_JSON.read_text())["context"]
    flags = {k: v for k, v in context.items() if k.startswith("@aws-cdk")}
    with tempfile.TemporaryDirectory() as outdir:
        app = App(context=flags, outdir=outdir)
        stack = Stack(app, "QueueProcessingAnchor")
        cluster = ecs.Cluster(stack, "Cluster")
        # The construct refuses a cluster without EC2 capacity; the simulation uses the stack's own group instead.
        cluster.add_capacity("Gpu", instance_type=ec2.InstanceType("g5.xlarge"), max_capacity=max_tasks)
        patterns.QueueProcessingEc2Service(
            stack,
            "Workers",
            cluster=cluster,
            image=ecs.ContainerImage.from_registry("vllm/vllm-openai"),
            memory_reservation_mib=12288,
            cpu=cpu_units,
            gpu_count=1,
            max_scaling_capacity=max_tasks,
            # Deployment settings only, not scaling: they silence the construct's warnings about its defaults.
            min_healthy_percent=100,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
        )
        return Template.from_stack(stack).to_json()


def scenarios(
    deployed_template: dict[str, Any],
    *,
    max_tasks: int,
    max_num_seqs: int,
    keda_spec,
    cpu_vcpus: float,
    candidate_jobs_per_task: float | None = None,
) -> list[Scenario]:
    """The five policies on one fleet ceiling."""
    deployed = read_policy(deployed_template)
    deployed.maximum = max_tasks
    queue_processing = read_policy(queue_processing_template(max_tasks, int(cpu_vcpus * 1024)))
    sagemaker = read_policy(sagemaker_resources(max_tasks))
    jobs_per_task = candidate_jobs_per_task or JOBS_PER_TASK_OVER_BATCH * max_num_seqs
    candidate = read_policy(candidate_resources(max_tasks, jobs_per_task))
    keda = dataclasses.replace(keda_spec, max_replicas=max_tasks)
    return [
        Scenario("deployed", policy=deployed, task_protection=True),
        Scenario("queue_processing", policy=queue_processing, task_protection=False,
                 initial_tasks=queue_processing.minimum, cpu_vcpus=cpu_vcpus),
        Scenario("sagemaker", policy=sagemaker, task_protection=False),
        Scenario("keda", keda=keda, task_protection=False),
        Scenario("candidate", policy=candidate, api_wake=ApiWake(), task_protection=False,
                 instance_warmup_s=CANDIDATE_INSTANCE_WARMUP_S),
    ]
