"""The scaling policy, capacity and worker settings as a synthesized CloudFormation template declares them.

``read_policy`` reads any mix of the resources Application Auto Scaling and CloudWatch use for an ECS service:

* ``AWS::ApplicationAutoScaling::ScalableTarget``: MinCapacity, MaxCapacity;
* ``AWS::ApplicationAutoScaling::ScalingPolicy``: StepScaling (AdjustmentType, StepAdjustments, Cooldown,
  MetricAggregationType, MinAdjustmentMagnitude) and TargetTrackingScaling (TargetValue, cooldowns, DisableScaleIn,
  a predefined metric or a customized one, single or metric math);
* ``AWS::CloudWatch::Alarm`` whose AlarmActions name a scaling policy: a single metric (Namespace, MetricName,
  Statistic, Period) or ``Metrics`` with metric math, Threshold, ComparisonOperator, EvaluationPeriods,
  DatapointsToAlarm, TreatMissingData.

``read`` adds what the template says about capacity, the worker and the wake: the Auto Scaling group's MaxSize, the
capacity provider's managed scaling target and instance warm-up, the launch template's instance type; from the
worker's task definition MAX_NUM_SEQS and MODEL, whether the weights live on a host volume, its TASK_PROTECTION mode
and decode rate, and whether the task role may set task protection; and which functions wake the service from zero
(a MODEL_FLEETS route naming the service, ecs:UpdateService on it in the function's role) and how often
(WAKE_CHECK_INTERVAL_S). What it cannot model it refuses, naming the resource and property.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from async_inference import config as _env
from async_inference import settings as _settings
from async_inference.catalog_template import function_variables
from async_inference.keep_alive import (
    ENV_KEEP_ALIVE_POLICY,
    ENV_KEEP_ALIVE_SERVICE,
    METRIC_KEEP_WARM,
    KeepAlivePolicy,
)
from bench.scaling.autoscaling import Step, StepPolicy, TargetTrackingPolicy
from bench.scaling.cloudwatch import Alarm, MetricId, MetricQuery, MetricStat
from bench.scaling.ecs import ClusterConfig
from bench.scaling.figures import DEFAULT_COOLDOWN_S, INSTANCE_WARMUP_S
from cdk.capacity import INSTANCE_GPUS

PREDEFINED = {
    "ECSServiceAverageCPUUtilization": MetricId("AWS/ECS", "CPUUtilization"),
    "ECSServiceAverageMemoryUtilization": MetricId("AWS/ECS", "MemoryUtilization"),
}


class TemplateError(ValueError):
    """The template holds a scaling construct the simulator does not model."""


@dataclass
class PolicySpec:
    """The scaling policy of one scalable target, ready to simulate."""

    minimum: int
    maximum: int
    alarms: list[Alarm] = field(default_factory=list)
    steps: dict[str, StepPolicy] = field(default_factory=dict)
    tracking: list[TargetTrackingPolicy] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerSpec:
    max_num_seqs: int
    model: str
    instance_type: str
    stop_timeout_s: int | None
    task_protection: str = _env.DEFAULT_TASK_PROTECTION  # TASK_PROTECTION; "off" when the role may not set it
    task_protection_tokens_per_s: float = _env.DEFAULT_TASK_PROTECTION_TOKENS_PER_S
    kind: str = "chat"  # MODEL_KIND: "chat", or "embedding" (prefill only)


@dataclass(frozen=True)
class WakeSpec:
    """The wake from zero: the functions that may set the service's desired count, how often each checks, and how
    long a wake holds the scaling minimum at one task (0 when the template gives none, or no permission for it), and
    the maximum the hold keeps meanwhile (None: none)."""

    functions: tuple[str, ...]
    check_interval_s: float
    hold_s: float = 0.0
    starts_instance: bool = False  # every waking function names the GPU group and may raise its desired capacity
    # The scaling maximum while the hold lasts (None: the hold raises the minimum only).
    hold_max_tasks: int | None = None


@dataclass
class Deployed:
    policy: PolicySpec
    cluster: ClusterConfig
    worker: WorkerSpec
    wake: WakeSpec | None = None
    # The learned keep-alive's decision function (None: none, or no alarm reads its decision).
    keep_alive: KeepAlivePolicy | None = None


def _resources(template: Mapping[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template.get("Resources", {}).items() if v.get("Type") == type_}


def _ref(value: Any) -> str | None:
    if isinstance(value, dict):
        if "Ref" in value:
            return value["Ref"]
        if "Fn::GetAtt" in value:
            return value["Fn::GetAtt"][0]
    return None


def _stat(metric: Mapping[str, Any], stat: str, period: int, others: frozenset[str] = frozenset()) -> MetricStat:
    """A metric of the template; an SQS metric of a queue in ``others`` (not the job queue the trace fills) keeps
    its queue's logical id, so that the simulator tells the lanes apart."""
    queue = next((_ref(d.get("Value")) for d in metric.get("Dimensions", []) if d.get("Name") == "QueueName"), None)
    resource = queue if metric["Namespace"] == "AWS/SQS" and queue in others else ""
    return MetricStat(MetricId(metric["Namespace"], metric["MetricName"], resource), stat, int(period))


def _other_queues(template: Mapping[str, Any]) -> frozenset[str]:
    """Queues the alarms read besides the job queue (the worker's JOBS_QUEUE_URL): the batch lane, say. Without a
    worker task definition (an anchor's template) every queue is the job queue."""
    job_queue = None
    for definition in _resources(template, "AWS::ECS::TaskDefinition").values():
        for container in definition["Properties"].get("ContainerDefinitions", []):
            for entry in container.get("Environment", []):
                if entry.get("Name") == _env.ENV_QUEUE_URL:
                    job_queue = _ref(entry.get("Value"))
    if job_queue is None:
        return frozenset()
    return frozenset(_resources(template, "AWS::SQS::Queue")) - {job_queue}


def _query(
    where: str, props: Mapping[str, Any], default_period: int = 60, others: frozenset[str] = frozenset()
) -> MetricQuery:
    """A single metric (Namespace/MetricName/Statistic/Period) or a ``Metrics`` list with one returned expression."""
    if "Metrics" in props:
        stats: dict[str, MetricStat] = {}
        expression = None
        for entry in props["Metrics"]:
            if "MetricStat" in entry:
                ms = entry["MetricStat"]
                stats[entry["Id"]] = _stat(ms["Metric"], ms["Stat"], ms.get("Period", default_period), others)
            if entry.get("ReturnData", True) and "Expression" in entry:
                if expression is not None:
                    raise TemplateError(f"{where}: more than one expression returns data")
                expression = entry["Expression"]
            elif entry.get("ReturnData", True) and "MetricStat" in entry and len(props["Metrics"]) == 1:
                expression = None
        return MetricQuery(stats, expression, label=str(props.get("Label", "")))
    if "MetricName" not in props:
        raise TemplateError(f"{where}: neither MetricName nor Metrics")
    if "ExtendedStatistic" in props:
        raise TemplateError(f"{where}: ExtendedStatistic (percentiles) is not modelled")
    stat = props.get("Statistic", "Average")
    period = props.get("Period", default_period)
    return MetricQuery({"m1": _stat(props, stat, period, others)})


def _steps(policy_id: str, config: Mapping[str, Any]) -> StepPolicy:
    steps = [
        Step(
            lower=float(s["MetricIntervalLowerBound"]) if "MetricIntervalLowerBound" in s else None,
            upper=float(s["MetricIntervalUpperBound"]) if "MetricIntervalUpperBound" in s else None,
            adjustment=int(s["ScalingAdjustment"]),
        )
        for s in config["StepAdjustments"]
    ]
    return StepPolicy(
        name=policy_id,
        adjustment_type=config["AdjustmentType"],
        steps=steps,
        aggregation=config.get("MetricAggregationType", "Average"),
        cooldown_s=float(config.get("Cooldown", DEFAULT_COOLDOWN_S)),
        min_adjustment_magnitude=config.get("MinAdjustmentMagnitude"),
    )


def _tracking(policy_id: str, config: Mapping[str, Any]) -> TargetTrackingPolicy:
    if "PredefinedMetricSpecification" in config:
        kind = config["PredefinedMetricSpecification"]["PredefinedMetricType"]
        if kind not in PREDEFINED:
            raise TemplateError(f"{policy_id}: predefined metric {kind} is not modelled")
        query = MetricQuery({"m1": MetricStat(PREDEFINED[kind], "Average", 60)})
    elif "CustomizedMetricSpecification" in config:
        spec = config["CustomizedMetricSpecification"]
        if "Metrics" in spec:
            # Target tracking's metric data queries nest the stat one level deeper than alarms' do.
            metrics = [
                {**e, "MetricStat": {**e["MetricStat"], "Period": e["MetricStat"].get("Period", 60)}}
                if "MetricStat" in e
                else e
                for e in spec["Metrics"]
            ]
            query = _query(policy_id, {"Metrics": metrics})
        else:
            query = _query(policy_id, spec)
    else:
        raise TemplateError(f"{policy_id}: target tracking without a metric specification")
    return TargetTrackingPolicy(
        name=policy_id,
        query=query,
        target=float(config["TargetValue"]),
        scale_out_cooldown_s=float(config.get("ScaleOutCooldown", DEFAULT_COOLDOWN_S)),
        scale_in_cooldown_s=float(config.get("ScaleInCooldown", DEFAULT_COOLDOWN_S)),
        disable_scale_in=bool(config.get("DisableScaleIn", False)),
    )


def read_policy(template: Mapping[str, Any]) -> PolicySpec:
    """The one ECS scalable target's policies and the alarms that drive them."""
    targets = {
        k: v
        for k, v in _resources(template, "AWS::ApplicationAutoScaling::ScalableTarget").items()
        if v["Properties"].get("ScalableDimension") == "ecs:service:DesiredCount"
    }
    if len(targets) != 1:
        raise TemplateError(f"expected one ECS ScalableTarget (ecs:service:DesiredCount), found {len(targets)}")
    target_id, target = next(iter(targets.items()))
    spec = PolicySpec(
        minimum=int(target["Properties"]["MinCapacity"]), maximum=int(target["Properties"]["MaxCapacity"])
    )
    others = _other_queues(template)
    for policy_id, policy in _resources(template, "AWS::ApplicationAutoScaling::ScalingPolicy").items():
        props = policy["Properties"]
        if _ref(props.get("ScalingTargetId")) not in (target_id, None):
            continue
        kind = props["PolicyType"]
        if kind == "StepScaling":
            spec.steps[policy_id] = _steps(policy_id, props["StepScalingPolicyConfiguration"])
        elif kind == "TargetTrackingScaling":
            tracking = _tracking(policy_id, props["TargetTrackingScalingPolicyConfiguration"])
            spec.tracking.append(tracking)
            spec.alarms.extend(tracking.alarms())
        else:
            raise TemplateError(f"{policy_id}: PolicyType {kind} is not modelled")
    for alarm_id, alarm in _resources(template, "AWS::CloudWatch::Alarm").items():
        props = alarm["Properties"]
        actions = tuple(a for a in (_ref(x) for x in props.get("AlarmActions", [])) if a in spec.steps)
        if not actions:
            continue
        periods = int(props["EvaluationPeriods"])
        spec.alarms.append(
            Alarm(
                name=alarm_id,
                query=_query(alarm_id, props, others=others),
                threshold=float(props["Threshold"]),
                comparison=props["ComparisonOperator"],
                evaluation_periods=periods,
                datapoints_to_alarm=int(props.get("DatapointsToAlarm", periods)),
                treat_missing=props.get("TreatMissingData", "missing"),
                actions=actions,
            )
        )
    unused = set(spec.steps) - {a for alarm in spec.alarms for a in alarm.actions}
    if unused:
        raise TemplateError(f"step policies no alarm invokes: {sorted(unused)}")
    return spec


def _single(template: Mapping[str, Any], type_: str) -> tuple[str, dict[str, Any]]:
    found = _resources(template, type_)
    if len(found) != 1:
        raise TemplateError(f"expected one {type_}, found {len(found)}")
    return next(iter(found.items()))


def _worker_container(template: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    for task_def in _resources(template, "AWS::ECS::TaskDefinition").values():
        for container in task_def["Properties"].get("ContainerDefinitions", []):
            env = {e["Name"]: e.get("Value") for e in container.get("Environment", [])}
            if "MAX_NUM_SEQS" in env:
                return task_def, container
    raise TemplateError("no task definition has a container with MAX_NUM_SEQS (the GPU worker)")


def _names_service(value: Any, service_id: str, service: Mapping[str, Any]) -> bool:
    """Whether ``value`` names the service: a Ref of it, or the ARN built from its fixed ServiceName and its cluster's
    name (how the stack names it, so that the functions do not wait for the service: cdk/gpu_worker_service.py)."""
    if _ref(value) == service_id:
        return True
    name, cluster = service["Properties"].get("ServiceName"), _ref(service["Properties"].get("Cluster"))
    if not name or not isinstance(value, dict) or "Fn::Join" not in value:
        return False
    parts = value["Fn::Join"][1]
    return {"Ref": cluster} in parts and isinstance(parts[-1], str) and parts[-1].endswith(f"/{name}")


def _routes_service(value: Any, service: Mapping[str, Any]) -> bool:
    """Whether MODEL_FLEETS (``async_inference.fleets``, a JSON object joined with the stack's tokens) names the
    service's ARN as a route's ``worker_service``: its cluster's Ref, then a part going on with ``/<its name>"``."""
    name, cluster = service["Properties"].get("ServiceName"), _ref(service["Properties"].get("Cluster"))
    if not name or not isinstance(value, dict) or "Fn::Join" not in value:
        return False
    parts = value["Fn::Join"][1]
    return any(
        part == {"Ref": cluster} and isinstance(after, str) and after.startswith(f'/{name}"')
        for part, after in zip(parts, parts[1:], strict=False)
    )


def _routes_group(value: Any, group_id: str) -> bool:
    """Whether MODEL_FLEETS names the GPU group ``group_id`` as a route's ``worker_group`` (the group a wake of that
    fleet starts an instance in)."""
    if not isinstance(value, dict) or "Fn::Join" not in value:
        return False
    parts = value["Fn::Join"][1]
    return any(
        isinstance(before, str) and before.endswith('"worker_group":"') and part == {"Ref": group_id}
        for before, part in zip(parts, parts[1:], strict=False)
    )


def _route_hold_max_tasks(value: Any, service: Mapping[str, Any]) -> int | None:
    """The ``worker_hold_max_tasks`` of the MODEL_FLEETS route that names the service (``_routes_service``), or
    None."""
    name, cluster = service["Properties"].get("ServiceName"), _ref(service["Properties"].get("Cluster"))
    if not name or not isinstance(value, dict) or "Fn::Join" not in value:
        return None
    parts = value["Fn::Join"][1]
    for part, after in zip(parts, parts[1:], strict=False):
        if part == {"Ref": cluster} and isinstance(after, str):
            found = re.match(rf'/{re.escape(name)}","worker_hold_max_tasks":(\d+)', after)
            if found:
                return int(found.group(1))
    return None


def _role_updates(template: Mapping[str, Any], role: str | None, service_id: str, service: Mapping[str, Any]) -> bool:
    """Whether ``role`` may ecs:UpdateService on an ARN naming the service (``_names_service``)."""
    for policy in _resources(template, "AWS::IAM::Policy").values():
        if role not in (_ref(r) for r in policy["Properties"].get("Roles", [])):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            if statement.get("Effect") == "Allow" and "ecs:UpdateService" in actions:
                if any(_names_service(r, service_id, service) for r in resources):
                    return True
    return False


def _role_allows(template: Mapping[str, Any], role: str | None, action: str, resource_ref: Any) -> bool:
    """Whether an AWS::IAM::Policy attached to ``role`` allows ``action`` on the resource ``resource_ref`` names (a
    logical id, the ARN as the template writes it, or ``"*"``: on every resource)."""
    for policy in _resources(template, "AWS::IAM::Policy").values():
        if role not in (_ref(r) for r in policy["Properties"].get("Roles", [])):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            allowed = statement.get("Effect") == "Allow" and action in actions
            if allowed and any(resource_ref in (_ref(r), r) for r in resources):
                return True
    return False


def read_wake(template: Mapping[str, Any]) -> WakeSpec | None:
    """The functions that wake the worker service from zero (their MODEL_FLEETS route names it), or None when none
    does."""
    service_id, service = _single(template, "AWS::ECS::Service")
    group_id, _ = _single(template, "AWS::AutoScaling::AutoScalingGroup")
    functions, intervals, holds, starts, caps = [], set(), set(), set(), set()
    for function_id, function in _resources(template, "AWS::Lambda::Function").items():
        variables = function_variables(template, function_id)  # the routes: from the catalog it reads
        routes = variables.get(_env.ENV_MODEL_FLEETS)
        if not _routes_service(routes, service):
            continue
        role = _ref(function["Properties"].get("Role"))
        if not (
            _role_allows(template, role, "ecs:UpdateService", service_id)
            or _role_updates(template, role, service_id, service)
        ):
            raise TemplateError(
                f"{function_id}: its {_env.ENV_MODEL_FLEETS} route names {service_id} but its role may not "
                "ecs:UpdateService it; the wake would fail at every check"
            )
        functions.append(function_id)
        intervals.add(float(variables.get(_env.ENV_WAKE_CHECK_INTERVAL_S, _env.DEFAULT_WAKE_CHECK_INTERVAL_S)))
        hold = float(variables.get(_env.ENV_WAKE_HOLD_S, 0) or 0)
        if hold and not all(
            _role_allows(template, role, a, "*")
            for a in ("application-autoscaling:RegisterScalableTarget", "application-autoscaling:PutScheduledAction")
        ):
            hold = 0.0  # the hold's calls would be refused: the wake stands without it
        holds.add(hold)
        most = _route_hold_max_tasks(routes, service)
        caps.add(most if hold else None)
        # The instance start: the group named in the route, and SetDesiredCapacity on it in the role.
        starts.add(_routes_group(routes, group_id) and _role_allows_group(template, role, group_id))
    if not functions:
        return None
    if len(intervals) != 1 or len(holds) != 1 or len(starts) != 1 or len(caps) != 1:
        raise TemplateError(
            f"functions {functions} wake the service at different intervals {sorted(intervals)}, "
            f"holds {sorted(holds)}, with and without the instance start, or hold maxima {caps}"
        )
    return WakeSpec(
        functions=tuple(sorted(functions)),
        check_interval_s=intervals.pop(),
        hold_s=holds.pop(),
        starts_instance=starts.pop(),
        hold_max_tasks=caps.pop(),
    )


def read_keep_alive(template: Mapping[str, Any], policy: PolicySpec) -> KeepAlivePolicy | None:
    """The learned keep-alive of the worker service (``cdk.keep_alive.LearnedKeepAlive``): the function whose
    KEEP_ALIVE_SERVICE names the service, run by a schedule, whose role may publish its decision, read by an alarm of
    ``policy``. None when there is none; a function whose role may not publish, or whose decision no alarm reads,
    decides nothing and is read as none."""
    service_id, service = _single(template, "AWS::ECS::Service")
    name = service["Properties"].get("ServiceName")
    keep_warm = MetricId(_settings.METRICS_NAMESPACE, METRIC_KEEP_WARM)
    if not any(keep_warm in alarm.query.metrics() for alarm in policy.alarms):
        return None
    scheduled = {
        _ref(t.get("Arn"))
        for rule in _resources(template, "AWS::Events::Rule").values()
        if rule["Properties"].get("ScheduleExpression")
        for t in rule["Properties"].get("Targets", [])
    }
    for function_id, function in _resources(template, "AWS::Lambda::Function").items():
        variables = function["Properties"].get("Environment", {}).get("Variables", {})
        named = variables.get(ENV_KEEP_ALIVE_SERVICE)
        if ENV_KEEP_ALIVE_POLICY not in variables or not (named == name or _ref(named) == service_id):
            continue
        role = _ref(function["Properties"].get("Role"))
        if function_id in scheduled and _role_allows(template, role, "cloudwatch:PutMetricData", "*"):
            return KeepAlivePolicy.from_json(variables[ENV_KEEP_ALIVE_POLICY])
    return None


def read_capacity_choices(template: Mapping[str, Any], group_id: str) -> tuple[int, int | None, bool, bool]:
    """The warm pool's stopped instances beside ``group_id`` while it is at zero (0 without a pool) and the pool's
    MinSize, whether a function scheduled every minute releases the group's empty instances (its role may set the
    group's desired capacity), and whether the pool pre-initializes its instances: a launch lifecycle hook on the group
    (which holds an instance launched into the pool in Warmed:Pending:Wait) and user data that pulls the image and
    completes the hook. A pool that sets ReuseOnScaleIn is refused: the ECS Developer Guide says it cannot be set for a
    group used by ECS."""
    pool, min_size, pre_initialized = 0, None, False
    max_size = int(template["Resources"][group_id]["Properties"]["MaxSize"])
    for pool_id, resource in _resources(template, "AWS::AutoScaling::WarmPool").items():
        props = resource["Properties"]
        if _ref(props.get("AutoScalingGroupName")) != group_id:
            continue
        if props.get("PoolState", "Stopped") != "Stopped":
            raise TemplateError(f"{pool_id}: PoolState {props.get('PoolState')} is not modelled (Stopped only)")
        if props.get("InstanceReusePolicy", {}).get("ReuseOnScaleIn"):
            raise TemplateError(
                f'{pool_id}: ReuseOnScaleIn cannot be set for a group used by ECS (ECS Developer Guide, "Configuring '
                'pre-initialized instances for your Amazon ECS Auto Scaling group"); it is not modelled'
            )
        # PutWarmPool: the pool holds MAX(MinSize, MaxGroupPreparedCapacity - desired), the group's MaxSize standing
        # for a MaxGroupPreparedCapacity not set (or -1); at zero in service, the larger of the two.
        min_size = int(props.get("MinSize", 0))
        prepared = int(props.get("MaxGroupPreparedCapacity", -1))
        pool = max(min_size, prepared if prepared >= 0 else max_size)
        pre_initialized = _launch_hook(template, group_id) and _user_data_pre_initializes(template, group_id)
    scheduled = {
        _ref(t.get("Arn"))
        for rule in _resources(template, "AWS::Events::Rule").values()
        if rule["Properties"].get("ScheduleExpression") == "rate(1 minute)"
        for t in rule["Properties"].get("Targets", [])
    }
    release = False
    for function_id, function in _resources(template, "AWS::Lambda::Function").items():
        # The release function: run every minute, and its role may lower this group's desired capacity.
        if function_id in scheduled and _role_allows_group(
            template, _ref(function["Properties"].get("Role")), group_id
        ):
            release = True
    return pool, min_size, release, pre_initialized


def _launch_hook(template: Mapping[str, Any], group_id: str) -> bool:
    """Whether a lifecycle hook on ``group_id`` holds launching instances."""
    return any(
        _ref(hook["Properties"].get("AutoScalingGroupName")) == group_id
        and hook["Properties"].get("LifecycleTransition") == "autoscaling:EC2_INSTANCE_LAUNCHING"
        for hook in _resources(template, "AWS::AutoScaling::LifecycleHook").values()
    )


def _user_data_pre_initializes(template: Mapping[str, Any], group_id: str) -> bool:
    """Whether the group's launch template's user data pulls an image and completes a lifecycle action (the text of
    its Fn::Join parts; expressions in it do not matter here)."""
    group = template["Resources"][group_id]["Properties"]
    launch_id = _ref(group.get("LaunchTemplate", {}).get("LaunchTemplateId"))
    if launch_id is None:
        return False
    user_data = template["Resources"][launch_id]["Properties"]["LaunchTemplateData"].get("UserData", {})
    rendered = user_data.get("Fn::Base64", user_data) if isinstance(user_data, dict) else user_data
    parts = rendered.get("Fn::Join", ["", []])[1] if isinstance(rendered, dict) else [rendered]
    text = "".join(part for part in parts if isinstance(part, str))
    return "docker pull" in text and "complete-lifecycle-action" in text


def _role_allows_group(template: Mapping[str, Any], role: str | None, group_id: str) -> bool:
    """Whether ``role`` may call autoscaling:SetDesiredCapacity on an ARN naming ``group_id``."""
    for policy in _resources(template, "AWS::IAM::Policy").values():
        if role not in (_ref(r) for r in policy["Properties"].get("Roles", [])):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if statement.get("Effect") == "Allow" and "autoscaling:SetDesiredCapacity" in actions:
                if group_id in json.dumps(statement["Resource"]):
                    return True
    return False


# cdk.gpu_worker_service.WORKER_ECS_SERVICE_NAME, the first model's service (importing it would load the CDK).
WORKER_ECS_SERVICE_NAME = "gpu-workers"
# One fleet per model (cdk/model_fleet.py): each ECS service has its own task definition, scalable target, capacity
# provider, Auto Scaling group and launch template. Of these, a fleet's template keeps its own only.
_PER_FLEET = (
    "AWS::ECS::Service",
    "AWS::ECS::TaskDefinition",
    "AWS::ApplicationAutoScaling::ScalableTarget",
    "AWS::ECS::CapacityProvider",
    "AWS::AutoScaling::AutoScalingGroup",
    "AWS::EC2::LaunchTemplate",
)


def fleet_templates(template: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One template per ECS service (per model's fleet), by the service's name (its logical id without one), in the
    template's order: each holds every shared resource and, of the per-fleet kinds (``_PER_FLEET``), only the
    service's own, so that ``read`` reads one fleet as it reads a one-model stack."""
    resources = template.get("Resources", {})
    fleets = {}
    for service_id, service in _resources(template, "AWS::ECS::Service").items():
        props = service["Properties"]
        provider = next((_ref(s.get("CapacityProvider")) for s in props.get("CapacityProviderStrategy", [])), None)
        group = None
        if provider in resources:
            arn = resources[provider]["Properties"].get("AutoScalingGroupProvider", {}).get("AutoScalingGroupArn")
            group = _ref(arn)
        launch = None
        if group in resources:
            launch = _ref(resources[group]["Properties"].get("LaunchTemplate", {}).get("LaunchTemplateId"))
        own = {service_id, _ref(props.get("TaskDefinition")), provider, group, launch}
        own |= {
            target_id
            for target_id, target in _resources(template, "AWS::ApplicationAutoScaling::ScalableTarget").items()
            if service_id in json.dumps(target["Properties"].get("ResourceId"))
        }
        kept = {k: v for k, v in resources.items() if v.get("Type") not in _PER_FLEET or k in own}
        fleets[str(props.get("ServiceName", service_id))] = {**template, "Resources": kept}
    # The first model's fleet first (its service's name has no suffix), the others in their template order.
    return dict(sorted(fleets.items(), key=lambda item: item[0] != WORKER_ECS_SERVICE_NAME))


def read_fleets(template: Mapping[str, Any]) -> dict[str, Deployed]:
    """Policy, capacity and worker of each model's fleet (``fleet_templates``)."""
    return {name: read(fleet) for name, fleet in fleet_templates(template).items()}


def read(template: Mapping[str, Any]) -> Deployed:
    """Policy, capacity and worker of the synthesized stack (of its one fleet: ``read_fleets`` for several)."""
    policy = read_policy(template)
    group_id, group = _single(template, "AWS::AutoScaling::AutoScalingGroup")
    warm_pool, pool_min_size, release_empty, pool_pre_initialized = read_capacity_choices(template, group_id)
    _, provider = _single(template, "AWS::ECS::CapacityProvider")
    managed = provider["Properties"]["AutoScalingGroupProvider"].get("ManagedScaling", {})
    if managed.get("Status") != "ENABLED":
        raise TemplateError(
            "AWS::ECS::CapacityProvider: ManagedScaling is not ENABLED; instances would not follow tasks"
        )
    _, launch = _single(template, "AWS::EC2::LaunchTemplate")
    instance_type = launch["Properties"]["LaunchTemplateData"]["InstanceType"]
    task_def, container = _worker_container(template)
    env = {e["Name"]: e.get("Value") for e in container.get("Environment", [])}
    volumes = {v["Name"]: v for v in task_def["Properties"].get("Volumes", [])}
    weights_on_host = any(
        m.get("ContainerPath") == "/models" and "Host" in volumes.get(m.get("SourceVolume"), {})
        for m in container.get("MountPoints", [])
    )
    task_role = _ref(task_def["Properties"].get("TaskRoleArn"))
    may_protect = any(
        _ref(r) == task_role and "ecs:UpdateTaskProtection" in json.dumps(p["Properties"]["PolicyDocument"])
        for p in _resources(template, "AWS::IAM::Policy").values()
        for r in p["Properties"].get("Roles", [])
    )
    mode = str(env.get(_env.ENV_TASK_PROTECTION) or _env.DEFAULT_TASK_PROTECTION)
    if mode not in _env.TASK_PROTECTION_MODES:
        raise TemplateError(
            f"the worker's {_env.ENV_TASK_PROTECTION} is {mode!r}, not one of {', '.join(_env.TASK_PROTECTION_MODES)}"
        )
    if not may_protect:
        mode = "off"  # the worker's calls to the agent would be refused
    protection = mode != "off"
    gpus_per_task = next((int(r["Value"]) for r in container.get("ResourceRequirements", []) if r["Type"] == "GPU"), 0)
    if gpus_per_task != 1:
        raise TemplateError(f"the worker container asks for {gpus_per_task} GPUs; the simulator models one per task")
    if instance_type not in INSTANCE_GPUS:
        raise TemplateError(f"AWS::EC2::LaunchTemplate: instance type {instance_type} is not in cdk.capacity")
    cluster = ClusterConfig(
        max_instances=int(group["Properties"]["MaxSize"]),
        gpus_per_instance=INSTANCE_GPUS[instance_type][1],
        target_capacity=float(managed.get("TargetCapacity", 100)),
        instance_warmup_s=float(managed.get("InstanceWarmupPeriod", INSTANCE_WARMUP_S)),
        weights_on_host=weights_on_host,
        uses_task_protection=protection,
        warm_pool=warm_pool,
        pool_min_size=pool_min_size,
        release_empty=release_empty,
        pool_pre_initialized=pool_pre_initialized,
    )
    worker = WorkerSpec(
        max_num_seqs=int(env["MAX_NUM_SEQS"]),
        model=str(env.get("MODEL", "")),
        instance_type=str(instance_type),
        stop_timeout_s=container.get("StopTimeout"),
        task_protection=mode,
        task_protection_tokens_per_s=float(
            env.get(_env.ENV_TASK_PROTECTION_TOKENS_PER_S) or _env.DEFAULT_TASK_PROTECTION_TOKENS_PER_S
        ),
        kind=str(env.get(_env.ENV_MODEL_KIND) or "chat"),
    )
    return Deployed(
        policy=policy,
        cluster=cluster,
        worker=worker,
        wake=read_wake(template),
        keep_alive=read_keep_alive(template, policy),
    )
