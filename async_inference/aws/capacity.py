"""The GPU workers' capacity as the wake from zero sees it: the ECS service (``WorkerService``: its desired count and
its held scaling minimum) and the Auto Scaling group behind it (``CapacityGroup``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import boto3
from botocore.config import Config

# The wake from zero runs inside a submit: one attempt with short timeouts, so an ECS endpoint that does not answer
# holds a submit up by 3 s at most (and once a minute per process); the scaling alarms wake the service regardless.
_WAKE_CONFIG = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1, read_timeout=2)


# The one scheduled action the wake keeps on the worker service's scalable target: the end of its hold.
WAKE_HOLD_RELEASE = "wake-hold-release"


class WorkerService:
    """The GPU workers' ECS service, as the wake from zero sees it: its desired task count, read and set, and its
    scaling minimum, held for a while."""

    def __init__(self, cluster: str, service: str, ecs: Any | None = None) -> None:
        self.cluster = cluster
        self.service = service
        self._ecs = ecs or boto3.client("ecs", config=_WAKE_CONFIG)

    def desired_count(self) -> int:
        response = self._ecs.describe_services(cluster=self.cluster, services=[self.service])
        if not response.get("services"):
            raise LookupError(f"no ECS service {self.service} in cluster {self.cluster}: {response.get('failures')}")
        return int(response["services"][0]["desiredCount"])

    def set_desired_count(self, count: int) -> None:
        self._ecs.update_service(cluster=self.cluster, service=self.service, desiredCount=count)

    def hold(
        self,
        *,
        release_at: dt.datetime,
        maximum: int | None = None,
        restore_max: int | None = None,
        autoscaling: Any | None = None,
    ) -> None:
        """Hold the service's Application Auto Scaling minimum at 1 until ``release_at`` (UTC), and with ``maximum``
        and ``restore_max`` its maximum at ``maximum``. The release (a one-time scheduled action that puts the minimum
        back to 0 and the maximum to ``restore_max``, replacing the previous one) is put first: if the raise then
        fails, nothing is left held."""
        scaling = autoscaling or self._autoscaling()
        target = {
            "ServiceNamespace": "ecs",
            "ScalableDimension": "ecs:service:DesiredCount",
            "ResourceId": f"service/{self.cluster.split('/')[-1]}/{self.service.split('/')[-1]}",
        }
        held, released = {"MinCapacity": 1}, {"MinCapacity": 0}
        if maximum is not None and restore_max is not None:
            held["MaxCapacity"], released["MaxCapacity"] = maximum, restore_max
        scaling.put_scheduled_action(
            **target,
            ScheduledActionName=WAKE_HOLD_RELEASE,
            Schedule=f"at({release_at.strftime('%Y-%m-%dT%H:%M:%S')})",
            ScalableTargetAction=released,
        )
        scaling.register_scalable_target(**target, **held)

    def _autoscaling(self) -> Any:
        if getattr(self, "_scaling", None) is None:
            self._scaling = boto3.client("application-autoscaling", config=_WAKE_CONFIG)
        return self._scaling


class CapacityGroup:
    """The GPU Auto Scaling group behind the worker service, as the wake sees it: its desired capacity, read and raised.

    A wake that finds the group at 0 sets it to 1 itself (SetDesiredCapacity), so that the instance launches (or
    leaves the warm pool) at once instead of after ECS managed scaling's next CapacityProviderReservation minute. It
    never lowers the count: a group above 0 already has capacity coming or running."""

    def __init__(self, name: str, autoscaling: Any | None = None) -> None:
        self.name = name
        self._autoscaling = autoscaling or boto3.client("autoscaling", config=_WAKE_CONFIG)

    def desired_capacity(self) -> int:
        groups = self._autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.name])["AutoScalingGroups"]
        if not groups:
            raise LookupError(f"no Auto Scaling group {self.name}")
        return int(groups[0]["DesiredCapacity"])

    def set_desired_capacity(self, count: int) -> None:
        # HonorCooldown False: the group's cooldown is for its own scaling policies, and this start answers a job.
        self._autoscaling.set_desired_capacity(
            AutoScalingGroupName=self.name, DesiredCapacity=count, HonorCooldown=False
        )
