"""The policies compared, each as the resources that would deploy it, read back through ``template.read_policy``.

* ``deployed``: the synthesized stack's own template (cdk/queue_scaling.py, the wake's functions, the worker's task
  protection mode, the capacity provider's warm-up), never re-typed.
* ``queue_processing``: aws-cdk-lib's ``QueueProcessingEc2Service`` with its defaults, synthesized here: step scaling
  on ApproximateNumberOfMessagesVisible ({upper 0: -1}, {lower 100: +1}, {lower 500: +5}, the construct's
  ``defaultScalingSteps``) plus target tracking on CPU at 50 %; minimum 1 (its ``minScalingCapacity`` default).
* ``sagemaker``: SageMaker Asynchronous Inference's documented policy ("Autoscale an asynchronous endpoint", SageMaker
  Developer Guide): target tracking on ApproximateBacklogSizePerInstance (target 5, Average) plus the
  ``HasBacklogWithoutCapacity-ScalingPolicy`` step (+1, Cooldown 300, its alarm 2 of 2 one-minute datapoints >= 1,
  TreatMissingData missing). In ECS terms the backlog is visible plus in-flight messages and the instances are the
  running tasks.
* ``keda``: deploy/eks/scaledobject.yaml, through ``keda.read_scaled_object``.

Every policy gets the same fleet ceiling (``max_tasks``) and runs on the same capacity layer (the stack's Auto Scaling
group under ECS managed scaling), so they differ only in how they set the task count.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.scaling.figures import INSTANCE_WARMUP_S
from bench.scaling.simulation import ApiWake, Scenario
from bench.scaling.template import read, read_policy

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
    keda_spec,
    cpu_vcpus: float,
    anchor_instance_warmup_s: float = INSTANCE_WARMUP_S,
) -> list[Scenario]:
    """The deployed stack and the three anchors on one fleet ceiling.

    ``deployed`` is everything the template says: its policy, its wake from zero (functions and interval), its
    worker's task protection mode and its capacity provider's instance warm-up. The anchors run with a worker that
    may be stopped mid-batch (the most favourable scale-in for them) on ECS's default instance warm-up
    (``anchor_instance_warmup_s``), as each would be deployed without this stack's choices.
    """
    deployed = read(deployed_template)
    policy = deployed.policy
    policy.maximum = max_tasks
    wake = ApiWake(check_interval_s=deployed.wake.check_interval_s) if deployed.wake else None
    queue_processing = read_policy(queue_processing_template(max_tasks, int(cpu_vcpus * 1024)))
    sagemaker = read_policy(sagemaker_resources(max_tasks))
    keda = dataclasses.replace(keda_spec, max_replicas=max_tasks)
    anchor = dict(task_protection="off", instance_warmup_s=anchor_instance_warmup_s)
    return [
        Scenario("deployed", policy=policy, api_wake=wake, task_protection=deployed.worker.task_protection,
                 protection_tokens_per_s=deployed.worker.task_protection_tokens_per_s,
                 instance_warmup_s=deployed.cluster.instance_warmup_s),
        Scenario("queue_processing", policy=queue_processing, initial_tasks=queue_processing.minimum,
                 cpu_vcpus=cpu_vcpus, **anchor),
        Scenario("sagemaker", policy=sagemaker, **anchor),
        Scenario("keda", keda=keda, **anchor),
    ]
