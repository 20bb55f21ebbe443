"""The policies compared, each as the resources that would deploy it, read back through ``template.read_policy``.

* ``deployed``: the synthesized stack's own template (cdk/queue_scaling.py, the wake's functions and hold, the
  worker's task protection mode, the capacity provider's warm-up, the warm pool and the instance release), never
  re-typed.
* ``queue_processing_default`` / ``_tuned``: aws-cdk-lib's ``QueueProcessingEc2Service``, synthesized here: step
  scaling on ApproximateNumberOfMessagesVisible plus target tracking on CPU at 50 %; minimum 1 (its
  ``minScalingCapacity`` default). Default: the construct's ``defaultScalingSteps`` ({upper 0: -1}, {lower 100: +1},
  {lower 500: +5}). Tuned: the same steps with the per-instance capacity in place of 100 ({lower C: +1},
  {lower 5C: +5}), as its ``scalingSteps`` documentation invites.
* ``sagemaker_default`` / ``_tuned``: SageMaker Asynchronous Inference's documented policy ("Autoscale an asynchronous
  endpoint", SageMaker Developer Guide): target tracking on ApproximateBacklogSizePerInstance plus the
  ``HasBacklogWithoutCapacity-ScalingPolicy`` step (+1, Cooldown 300, its alarm 2 of 2 one-minute datapoints >= 1,
  TreatMissingData missing). Default: the guide's example target of 5; tuned: the target the guide asks for, what one
  instance handles (C). In ECS terms the backlog is visible plus in-flight messages and the instances are the running
  tasks (read as 0 when Container Insights has none: SageMaker publishes its own metric at zero instances).
* ``keda_default`` / ``_tuned``: KEDA's aws-sqs-queue scaler at its defaults (queueLength 5, pollingInterval 30,
  cooldownPeriod 300) and tuned as its docs ask (queueLength C, pollingInterval 15).
* ``keda_shipped``: deploy/eks/scaledobject.yaml as the project ships it, through ``keda.read_scaled_object``: the
  tuned trigger, the fixed keep-alive as its cooldown, and the learned keep-alive's decision as a second trigger
  (not an anchor: the deployed policy as far as KEDA can express it).

C, the per-instance capacity, is the sequences one task batches (``max_num_seqs``).

Every policy gets the same fleet ceiling (``max_tasks``) and runs on the same capacity layer (the stack's Auto Scaling
group under ECS managed scaling), so they differ only in how they set the task count.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.scaling.figures import INSTANCE_WARMUP_S
from bench.scaling.keda import KedaSpec
from bench.scaling.simulation import ApiWake, Scenario
from bench.scaling.template import read, read_policy

ECS_TARGET = {"ScalableDimension": "ecs:service:DesiredCount", "ServiceNamespace": "ecs"}
CDK_JSON = Path(__file__).resolve().parents[2] / "cdk.json"


def _metric(id_: str, namespace: str, name: str, stat: str = "Maximum", period: int = 60) -> dict[str, Any]:
    return {
        "Id": id_,
        "MetricStat": {"Metric": {"Namespace": namespace, "MetricName": name}, "Stat": stat, "Period": period},
        "ReturnData": False,
    }


def _sqs(stat: str = "Maximum") -> list[dict[str, Any]]:
    return [
        _metric("visible", "AWS/SQS", "ApproximateNumberOfMessagesVisible", stat),
        _metric("inFlight", "AWS/SQS", "ApproximateNumberOfMessagesNotVisible", stat),
    ]


def _target(maximum: int, minimum: int = 0) -> dict[str, Any]:
    return {
        "Type": "AWS::ApplicationAutoScaling::ScalableTarget",
        "Properties": {"MinCapacity": minimum, "MaxCapacity": maximum, **ECS_TARGET},
    }


def sagemaker_resources(max_tasks: int, target: float = 5.0) -> dict[str, Any]:
    backlog_per_instance = {
        "Metrics": [
            *_sqs("Average"),
            _metric("instances", "ECS/ContainerInsights", "RunningTaskCount", "Average"),
            {"Id": "e1", "Expression": "(visible + inFlight) / instances", "ReturnData": True},
        ]
    }
    return {
        "Resources": {
            "Target": _target(max_tasks),
            "BacklogTracking": {
                "Type": "AWS::ApplicationAutoScaling::ScalingPolicy",
                "Properties": {
                    "PolicyType": "TargetTrackingScaling",
                    "ScalingTargetId": {"Ref": "Target"},
                    "TargetTrackingScalingPolicyConfiguration": {
                        "TargetValue": float(target),
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
                    "Metrics": [
                        *_sqs("Average"),
                        _metric("instances", "ECS/ContainerInsights", "RunningTaskCount", "Average"),
                        {
                            "Id": "e1",
                            "Expression": "IF(FILL(instances, 0) == 0 AND (visible + inFlight) > 0, 1, 0)",
                            "ReturnData": True,
                        },
                    ],
                    "Threshold": 1,
                    "ComparisonOperator": "GreaterThanOrEqualToThreshold",
                    "EvaluationPeriods": 2,
                    "DatapointsToAlarm": 2,
                    "TreatMissingData": "missing",
                    "AlarmActions": [{"Ref": "HasBacklogWithoutCapacityScalingPolicy"}],
                },
            },
        }
    }


@functools.cache
def queue_processing_template(max_tasks: int, cpu_units: int, per_instance: float | None = None) -> dict[str, Any]:
    """aws-cdk-lib's QueueProcessingEc2Service with its scaling defaults, or with its steps at ``per_instance``
    messages a task (tuned), synthesized (max raised to the common ceiling; the container reserves the instance's CPU
    so that CPUUtilization has a denominator). Cached: each trace's run reads the same synthesis."""
    from aws_cdk import App, Stack
    from aws_cdk import aws_applicationautoscaling as appscaling
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
            scaling_steps=None
            if per_instance is None
            else [
                appscaling.ScalingInterval(upper=0, change=-1),
                appscaling.ScalingInterval(lower=per_instance, change=+1),
                appscaling.ScalingInterval(lower=5 * per_instance, change=+5),
            ],
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
    anchors_on_stack_capacity: bool = False,
    only: tuple[str, ...] | None = None,
) -> list[Scenario]:
    """The deployed stack and the three anchors, each at its default and its tuning, on one fleet ceiling.

    ``deployed`` is everything the template says: its policy, its wake from zero (functions, interval, hold, instance
    start), its
    worker's task protection mode, its capacity provider's instance warm-up, its warm pool and its instance release.
    The anchors run with a worker that may be stopped mid-batch (the most favourable scale-in for them) on ECS's
    default capacity layer (``anchor_instance_warmup_s``, no warm pool, managed scaling's own scale-in), as each would
    be deployed without this stack's choices; ``anchors_on_stack_capacity`` gives them the stack's capacity layer
    instead (a sensitivity row). ``only``: the names to build (by default the deployed stack and the anchors;
    ``keda_shipped`` only when named).
    """
    deployed = read(deployed_template)
    policy = deployed.policy
    policy.maximum = max_tasks
    capacity = deployed.worker.max_num_seqs  # C: what one task (one instance) handles at once
    wake = (
        ApiWake(
            check_interval_s=deployed.wake.check_interval_s,
            hold_s=deployed.wake.hold_s,
            starts_instance=deployed.wake.starts_instance,
            hold_max_tasks=deployed.wake.hold_max_tasks,
        )
        if deployed.wake
        else None
    )
    anchor: dict[str, Any] = dict(
        task_protection="off", instance_warmup_s=anchor_instance_warmup_s, warm_pool=0, release_empty=False
    )
    if anchors_on_stack_capacity:
        anchor.update(
            instance_warmup_s=deployed.cluster.instance_warmup_s,
            warm_pool=deployed.cluster.warm_pool,
            release_empty=deployed.cluster.release_empty,
            pool_pre_initialized=deployed.cluster.pool_pre_initialized,
        )

    def wanted(name: str) -> bool:
        return only is None or name in only

    built = []
    if wanted("deployed"):
        built.append(
            Scenario(
                "deployed",
                policy=policy,
                api_wake=wake,
                task_protection=deployed.worker.task_protection,
                protection_tokens_per_s=deployed.worker.task_protection_tokens_per_s,
                instance_warmup_s=deployed.cluster.instance_warmup_s,
                warm_pool=deployed.cluster.warm_pool,
                release_empty=deployed.cluster.release_empty,
                pool_pre_initialized=deployed.cluster.pool_pre_initialized,
                keep_alive=deployed.keep_alive,
            )
        )
    for name, target in (("sagemaker_default", 5.0), ("sagemaker_tuned", float(capacity))):
        if wanted(name):
            built.append(Scenario(name, policy=read_policy(sagemaker_resources(max_tasks, target)), **anchor))
    defaults = KedaSpec(
        polling_interval_s=30,
        cooldown_period_s=300,
        min_replicas=0,
        max_replicas=max_tasks,
        queue_length=5,
        activation_queue_length=0,
        scale_on_in_flight=True,
        scale_on_delayed=False,
    )
    # Tuned as KEDA's aws-sqs-queue docs ask: queueLength what one pod handles; a 15 s poll; the rest its defaults.
    tuned = dataclasses.replace(defaults, polling_interval_s=15, queue_length=float(capacity))
    for name, spec in (("keda_default", defaults), ("keda_tuned", tuned)):
        if wanted(name):
            built.append(Scenario(name, keda=spec, eks=True, **anchor))
    if only is not None and "keda_shipped" in only:  # a row beside the anchors when asked for, not an anchor
        # The project's own ScaledObject (deploy/eks/), with the learned keep-alive's trigger when it has one.
        shipped = dataclasses.replace(keda_spec, max_replicas=max_tasks)
        learned = deployed.keep_alive if shipped.keep_warm_trigger else None
        built.append(Scenario("keda_shipped", keda=shipped, eks=True, keep_alive=learned, **anchor))
    for name, per_instance in (("queue_processing_default", None), ("queue_processing_tuned", float(capacity))):
        if wanted(name):
            qp = read_policy(queue_processing_template(max_tasks, int(cpu_vcpus * 1024), per_instance))
            built.append(Scenario(name, policy=qp, initial_tasks=qp.minimum, cpu_vcpus=cpu_vcpus, **anchor))
    return built
