"""Why a model's workers do not run: its GPU Auto Scaling group's latest scaling activity, when EC2 refused it.

``GET /v1/models`` answers each model with ``capacity`` set when its group's latest activity failed (a G/VT vCPU
quota of 0, no capacity for the type in the zones, a launch template fault), with EC2's own message, so a caller whose
jobs stay ``queued`` reads why. One DescribeScalingActivities (one record) per group per ``ttl_s`` per execution
environment: a listing costs nothing more, and the answer is at most that old. A read that fails reports nothing (the
listing never fails for it) and is logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from async_inference.fleets import FleetRoute
from async_inference_client.models.batches import Model, ModelCapacity, ModelList

logger = logging.getLogger("async_inference.capacity_state")

CAPACITY_TTL_S = 60.0
# DescribeScalingActivities' StatusCode of an activity that did not launch what it was asked to.
FAILED_STATUS_CODES = ("Failed", "Cancelled")


class CapacityState:
    """The capacity of each model's GPU group (``groups``: model name -> group name), read and cached."""

    def __init__(
        self,
        groups: Mapping[str, str],
        autoscaling: Any,
        *,
        ttl_s: float = CAPACITY_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.groups = dict(groups)
        self._autoscaling = autoscaling
        self._ttl_s = ttl_s
        self._clock = clock
        self._read: dict[str, tuple[float, ModelCapacity | None]] = {}

    def of_group(self, group: str) -> ModelCapacity | None:
        """The group's failure, or None when its latest activity succeeded, is under way, or there is none."""
        now = self._clock()
        cached = self._read.get(group)
        if cached is not None and now - cached[0] < self._ttl_s:
            return cached[1]
        try:
            activities = self._autoscaling.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=1)
        except Exception:
            logger.exception("could not read the scaling activities of %s", group)
            return None
        capacity = _failure(activities.get("Activities", []))
        self._read[group] = (now, capacity)
        return capacity

    @classmethod
    def from_routes(cls, routes: Mapping[str, FleetRoute] | None, autoscaling: Any) -> CapacityState:
        """Each routed model's GPU group (MODEL_FLEETS' ``worker_group``; none without wake from zero)."""
        groups = {model: route.worker_group for model, route in (routes or {}).items() if route.worker_group}
        return cls(groups, autoscaling)

    def annotate(self, model: Model) -> Model:
        """``model`` with ``capacity`` set when its group's latest launch failed."""
        group = self.groups.get(model.id)
        capacity = self.of_group(group) if group else None
        return model.model_copy(update={"capacity": capacity}) if capacity else model

    def annotate_list(self, models: ModelList) -> ModelList:
        return models.model_copy(update={"data": [self.annotate(model) for model in models.data]})


def _failure(activities: list[dict[str, Any]]) -> ModelCapacity | None:
    if not activities or activities[0].get("StatusCode") not in FAILED_STATUS_CODES:
        return None
    latest = activities[0]
    started = latest.get("StartTime")
    return ModelCapacity(
        state="launch_failed",
        reason=latest.get("StatusMessage") or latest.get("Description") or "the GPU instance launch failed",
        since=int(started.timestamp()) if started is not None else None,
    )
