"""Release the GPU instances that run no task, at once instead of after ECS managed scaling's 15 minutes.

ECS managed scaling terminates an empty instance only after 15 one-minute CapacityProviderReservation datapoints below
its target (ECS Developer Guide, "Amazon ECS cluster auto scaling"): every task that stops leaves a GPU instance paid
for a quarter of an hour. Once a minute this releases every instance of the cluster that runs no task:

1. every ACTIVE container instance with no running and no pending task is set to DRAINING, so that ECS places no new
   task on it;
2. they are described again: one that got a task before it drained is set back to ACTIVE and kept;
3. the others lose their Auto Scaling scale-in protection and the group's desired capacity drops by their number.

Nothing is released while a service of the cluster has tasks it has not started yet (desired above running): ECS may
be about to place one of them on an empty instance (the wake starts an instance and raises the service's desired
count together, and a task waiting for capacity is placed on the next instance that registers), and draining that
instance would send the task to wait for yet another one. The release waits for the next minute instead.

An instance that runs a task is never released: ECS turns on its scale-in protection before placing a task on it
("Control the instances Amazon ECS terminates", managed termination protection), the group's scale-in only picks
unprotected instances ("Use instance scale-in protection", EC2 Auto Scaling User Guide), and only the instances this
run drained and found empty lose their protection. The group terminates the released instance: ECS allows no
``ReuseOnScaleIn`` on its groups, so a warm pool (cdk/gpu_capacity.py) keeps pre-initialized instances of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("async_inference.instance_release")


@dataclass(frozen=True)
class Released:
    """What one run did: the EC2 instances released, and those kept because a task reached them first."""

    released: tuple[str, ...]
    kept: tuple[str, ...]


def _empty(instance: dict[str, Any]) -> bool:
    return instance.get("runningTasksCount", 0) == 0 and instance.get("pendingTasksCount", 0) == 0


def _describe(ecs: Any, cluster: str, arns: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for start in range(0, len(arns), 100):  # DescribeContainerInstances takes 100 at a time
        found += ecs.describe_container_instances(cluster=cluster, containerInstances=arns[start : start + 100])[
            "containerInstances"
        ]
    return found


def capacity_groups(ecs: Any, cluster: str) -> list[str]:
    """The Auto Scaling groups behind the cluster's capacity providers, by name (read from ECS, so that the function
    needs only the cluster's name)."""
    [described] = ecs.describe_clusters(clusters=[cluster])["clusters"]
    names = described.get("capacityProviders", [])
    if not names:
        return []
    providers = ecs.describe_capacity_providers(capacityProviders=names)["capacityProviders"]
    return [
        p["autoScalingGroupProvider"]["autoScalingGroupArn"].split("autoScalingGroupName/")[-1]
        for p in providers
        if "autoScalingGroupProvider" in p
    ]


def tasks_to_place(ecs: Any, cluster: str) -> int:
    """Tasks the cluster's services want and do not run yet: desired above running, summed over its services."""
    arns: list[str] = []
    for page in ecs.get_paginator("list_services").paginate(cluster=cluster):
        arns += page["serviceArns"]
    waiting = 0
    for start in range(0, len(arns), 10):  # DescribeServices takes 10 at a time
        for service in ecs.describe_services(cluster=cluster, services=arns[start : start + 10])["services"]:
            waiting += max(0, service.get("desiredCount", 0) - service.get("runningCount", 0))
    return waiting


def release_empty_instances(ecs: Any, autoscaling: Any, *, cluster: str, group: str) -> Released:
    """Drain, check again and release the cluster's instances that run no task (the protocol above)."""
    if tasks_to_place(ecs, cluster):
        return Released((), ())
    arns: list[str] = []
    for page in ecs.get_paginator("list_container_instances").paginate(cluster=cluster, status="ACTIVE"):
        arns += page["containerInstanceArns"]
    if not arns:
        return Released((), ())
    empty = [i["containerInstanceArn"] for i in _describe(ecs, cluster, arns) if _empty(i)]
    if not empty:
        return Released((), ())
    ecs.update_container_instances_state(cluster=cluster, containerInstances=empty, status="DRAINING")
    again = _describe(ecs, cluster, empty)
    release = [i for i in again if _empty(i)]
    keep = [i for i in again if not _empty(i)]
    if keep:
        ecs.update_container_instances_state(
            cluster=cluster, status="ACTIVE", containerInstances=[i["containerInstanceArn"] for i in keep]
        )
    instance_ids = [i["ec2InstanceId"] for i in release]
    if instance_ids:
        autoscaling.set_instance_protection(
            AutoScalingGroupName=group, InstanceIds=instance_ids, ProtectedFromScaleIn=False
        )
        desired = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"][0][
            "DesiredCapacity"
        ]
        autoscaling.set_desired_capacity(
            AutoScalingGroupName=group, HonorCooldown=False, DesiredCapacity=max(0, desired - len(instance_ids))
        )
        logger.info("released %d empty GPU instance(s): %s", len(instance_ids), instance_ids)
    return Released(tuple(instance_ids), tuple(i["ec2InstanceId"] for i in keep))
