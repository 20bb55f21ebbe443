"""What CloudFormation asks of a GPU fleet beyond creating its resources: the custom resources of
``cdk.fleet_lifecycle``, each handled by ``handle``.

* ``DESIRED_COUNT`` (the worker service's DesiredCount): the count the service has now, which is 0 when the stack is
  created (the service does not exist yet), so that CloudFormation waits for no GPU task (the first job's wake starts
  one: ``async_inference.wake``); on a later deploy, whatever scaling set, so that a deploy of new worker code never
  resets the fleet (CloudFormation sends a template's DesiredCount with every UpdateService,
  aws/containers-roadmap#493), nor does the deploy that first adds this resource to an existing stack.
* ``TASK_PROTECTION_RELEASE`` (deleted just before the worker service): sets the service to 0 tasks and lifts the
  scale-in protection of its tasks, which would otherwise keep the service's delete waiting until each protection
  lapses.
* ``INSTANCE_PROTECTION_RELEASE`` (deleted after the capacity provider, just before the Auto Scaling group): lifts
  the scale-in protection ECS managed termination protection left on the group's instances, which would otherwise
  keep the group's delete waiting for ever (aws/aws-cdk#18179, aws/containers-roadmap#2862).

The delete steps never fail a delete: what they could not do is logged, and CloudFormation goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("async_inference.fleet_deploy_steps")

DESIRED_COUNT = "Custom::WorkerDesiredCount"
TASK_PROTECTION_RELEASE = "Custom::WorkerTaskProtectionRelease"
INSTANCE_PROTECTION_RELEASE = "Custom::GpuInstanceProtectionRelease"
RESOURCE_TYPES = (DESIRED_COUNT, TASK_PROTECTION_RELEASE, INSTANCE_PROTECTION_RELEASE)
# The attribute of DESIRED_COUNT that the service's DesiredCount reads (Fn::GetAtt).
DESIRED_COUNT_ATTRIBUTE = "DesiredCount"
# Properties of the custom resources (cdk.fleet_lifecycle writes them, this module reads them).
PROP_CLUSTER = "Cluster"
PROP_SERVICE = "Service"
PROP_GROUP = "Group"
# API limits: UpdateTaskProtection takes 10 tasks a call, SetInstanceProtection 50 instances.
_TASKS_PER_CALL = 10
_INSTANCES_PER_CALL = 50


@dataclass
class StepResult:
    """What a step did: the custom resource's physical id and the attributes it returns (``Data``)."""

    physical_id: str
    data: dict[str, Any] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)  # tasks or instances whose protection was lifted


def current_desired_count(ecs: Any, cluster: str, service: str) -> int:
    """The service's desired count now; 0 if it does not exist (yet) or is being deleted."""
    active = _active(ecs, cluster, service)
    return int(active[0]["desiredCount"]) if active else 0


def release_task_protection(ecs: Any, cluster: str, service: str) -> list[str]:
    """Set ``service`` to 0 tasks and lift the scale-in protection of each of its tasks; the task ARNs released."""
    if not _service_exists(ecs, cluster, service):
        return []
    ecs.update_service(cluster=cluster, service=service, desiredCount=0)
    tasks: list[str] = []
    for page in ecs.get_paginator("list_tasks").paginate(cluster=cluster, serviceName=service):
        tasks += page.get("taskArns", [])
    for start in range(0, len(tasks), _TASKS_PER_CALL):
        ecs.update_task_protection(
            cluster=cluster, tasks=tasks[start : start + _TASKS_PER_CALL], protectionEnabled=False
        )
    return tasks


def _service_exists(ecs: Any, cluster: str, service: str) -> bool:
    return bool(_active(ecs, cluster, service))


def _active(ecs: Any, cluster: str, service: str) -> list[dict[str, Any]]:
    try:
        described = ecs.describe_services(cluster=cluster, services=[service]).get("services", [])
    except Exception as exc:
        if getattr(exc, "response", {}).get("Error", {}).get("Code") == "ClusterNotFoundException":
            return []
        raise
    return [s for s in described if s.get("status") == "ACTIVE"]


def release_instance_protection(autoscaling: Any, group: str) -> list[str]:
    """Lift the scale-in protection of every protected instance of ``group``; the instance ids released."""
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group]).get("AutoScalingGroups", [])
    protected = [
        instance["InstanceId"]
        for described in groups
        for instance in described.get("Instances", [])
        if instance.get("ProtectedFromScaleIn")
    ]
    for start in range(0, len(protected), _INSTANCES_PER_CALL):
        autoscaling.set_instance_protection(
            AutoScalingGroupName=group,
            InstanceIds=protected[start : start + _INSTANCES_PER_CALL],
            ProtectedFromScaleIn=False,
        )
    return protected


def handle(event: dict[str, Any], *, ecs: Any, autoscaling: Any) -> StepResult:
    """The step for one CloudFormation custom resource request (``RequestType`` Create, Update or Delete).

    Raises ValueError for a resource type this module does not handle; a delete step's AWS errors are logged and the
    delete reported done (a failed delete would leave the stack in DELETE_FAILED, or a rollback in ROLLBACK_FAILED,
    when what it failed to lift only slows the delete)."""
    resource_type = event["ResourceType"]
    request = event["RequestType"]
    props = event.get("ResourceProperties", {})
    if resource_type not in RESOURCE_TYPES:
        raise ValueError(f"{resource_type} is not one of {', '.join(RESOURCE_TYPES)}")
    if resource_type == INSTANCE_PROTECTION_RELEASE:
        physical_id = f"{props[PROP_GROUP]}/instance-protection-release"
    else:
        physical_id = f"{props[PROP_CLUSTER]}/{props[PROP_SERVICE]}/{resource_type.removeprefix('Custom::')}"
    if resource_type == DESIRED_COUNT:
        if request == "Delete":
            return StepResult(physical_id)
        # On Create too: a stack deployed before this resource existed creates it beside a running service, whose
        # count it must keep; in a new stack the service does not exist yet, and that reads 0.
        count = current_desired_count(ecs, props[PROP_CLUSTER], props[PROP_SERVICE])
        return StepResult(physical_id, {DESIRED_COUNT_ATTRIBUTE: count})
    if request != "Delete":
        return StepResult(physical_id)
    try:
        if resource_type == TASK_PROTECTION_RELEASE:
            released = release_task_protection(ecs, props[PROP_CLUSTER], props[PROP_SERVICE])
        else:
            released = release_instance_protection(autoscaling, props[PROP_GROUP])
    except Exception:
        logger.exception("%s could not lift protection; the delete goes on", physical_id)
        return StepResult(physical_id)
    logger.info("%s lifted the protection of %d", physical_id, len(released), extra={"released": released})
    return StepResult(physical_id, released=released)
