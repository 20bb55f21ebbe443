"""Application Auto Scaling as it acts on an ECS service's desired count: step scaling and target tracking.

Semantics modelled (Application Auto Scaling User Guide and API Reference):

* A step policy runs when its alarm invokes it (every period while the alarm is in ALARM). It aggregates the alarm's
  evaluated datapoints with its ``MetricAggregationType``, takes the breach (value minus threshold), picks the step
  whose bounds hold it (on an upper alarm the lower bound is inclusive, the upper exclusive; on a lower one the reverse)
  and computes the new capacity from the *current desired count*: ``ChangeInCapacity`` adds, ``ExactCapacity`` sets,
  ``PercentChangeInCapacity`` adds a percentage (at least ``MinAdjustmentMagnitude``).
* Cooldown. After a scale-out, during the cooldown the capacity that scale-out added counts as part of the next one:
  the policy scales out again only to a capacity larger than it reached. After a scale-in, further scale-ins of the
  policy are blocked until the cooldown ends; a scale-out is never blocked by a scale-in cooldown.
* Target tracking: the service creates two alarms on the policy's metric, scale-out after 3 one-minute datapoints above
  the target, scale-in after 15 below 90 % of it. Out: ``ceil(current x metric / target)``; in: the same, never below
  the minimum and never on missing data. A capacity of zero has no per-task metric: tracking cannot scale out from it.
* Several policies invoked in the same minute: the largest resulting capacity wins.
* The result is clamped to the scalable target's minimum and maximum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.scaling.cloudwatch import Alarm, MetricQuery, aggregate
from bench.scaling.figures import (
    DEFAULT_COOLDOWN_S,
    TARGET_TRACKING_IN_DATAPOINTS,
    TARGET_TRACKING_IN_FRACTION,
    TARGET_TRACKING_OUT_DATAPOINTS,
)


@dataclass(frozen=True)
class Step:
    lower: float | None
    upper: float | None
    adjustment: int

    def holds(self, breach: float, upper_alarm: bool = True) -> bool:
        """Whether the breach falls in this step. On an upper alarm (Greater...) the lower bound is inclusive and the
        upper exclusive; on a lower alarm (Less...) the reverse, so a metric equal to the threshold takes the step
        that starts (or ends) at 0."""
        if upper_alarm:
            return (self.lower is None or breach >= self.lower) and (self.upper is None or breach < self.upper)
        return (self.lower is None or breach > self.lower) and (self.upper is None or breach <= self.upper)


@dataclass
class StepPolicy:
    """A step scaling policy; its alarm is found by the id in the alarm's actions."""

    name: str
    adjustment_type: str
    steps: Sequence[Step]
    aggregation: str = "Average"
    cooldown_s: float = DEFAULT_COOLDOWN_S
    min_adjustment_magnitude: int | None = None
    _out_until: float = -math.inf
    _out_base: int = 0
    _out_reached: int = 0
    _in_until: float = -math.inf

    def __post_init__(self) -> None:
        if self.adjustment_type not in ("ChangeInCapacity", "ExactCapacity", "PercentChangeInCapacity"):
            raise ValueError(f"policy {self.name}: AdjustmentType {self.adjustment_type!r} is unknown")

    def step_for(self, breach: float, upper_alarm: bool = True) -> Step | None:
        return next((s for s in self.steps if s.holds(breach, upper_alarm)), None)

    def propose(
        self, window: Sequence[float], threshold: float, current: int, now: float, upper_alarm: bool = True
    ) -> int | None:
        """The capacity this invocation asks for, or None (no step, or held by a cooldown)."""
        if not window:
            return None
        breach = aggregate(self.aggregation, window) - threshold
        step = self.step_for(breach, upper_alarm)
        if step is None:
            return None
        in_out_cooldown = now < self._out_until
        base = self._out_base if in_out_cooldown else current
        if self.adjustment_type == "ExactCapacity":
            target = step.adjustment
        elif self.adjustment_type == "ChangeInCapacity":
            target = base + step.adjustment
        else:
            change = base * step.adjustment / 100
            magnitude = max(abs(change), self.min_adjustment_magnitude or 0)
            target = base + int(math.copysign(math.floor(magnitude), change)) if change else base
        if target > current:
            if in_out_cooldown and target <= self._out_reached:
                return None
            return target
        if target < current:
            return None if now < self._in_until else target
        return None

    def applied(self, before: int, after: int, now: float) -> None:
        if after > before:
            if now >= self._out_until:
                self._out_base = before
            self._out_until = now + self.cooldown_s
            self._out_reached = after
        elif after < before:
            self._in_until = now + self.cooldown_s


@dataclass
class TargetTrackingPolicy:
    """A target tracking policy; ``alarms()`` are the two alarms Application Auto Scaling creates for it."""

    name: str
    query: MetricQuery
    target: float
    scale_out_cooldown_s: float = DEFAULT_COOLDOWN_S
    scale_in_cooldown_s: float = DEFAULT_COOLDOWN_S
    disable_scale_in: bool = False
    _out_until: float = -math.inf
    _out_reached: int = 0
    _in_until: float = -math.inf

    def alarms(self) -> list[Alarm]:
        high = Alarm(
            name=f"{self.name}-AlarmHigh",
            query=self.query,
            threshold=self.target,
            comparison="GreaterThanThreshold",
            evaluation_periods=TARGET_TRACKING_OUT_DATAPOINTS,
            datapoints_to_alarm=TARGET_TRACKING_OUT_DATAPOINTS,
            actions=(f"{self.name}#out",),
        )
        alarms = [high]
        if not self.disable_scale_in:
            alarms.append(
                Alarm(
                    name=f"{self.name}-AlarmLow",
                    query=self.query,
                    threshold=self.target * TARGET_TRACKING_IN_FRACTION,
                    comparison="LessThanThreshold",
                    evaluation_periods=TARGET_TRACKING_IN_DATAPOINTS,
                    datapoints_to_alarm=TARGET_TRACKING_IN_DATAPOINTS,
                    actions=(f"{self.name}#in",),
                )
            )
        return alarms

    def propose(self, direction: str, window: Sequence[float], current: int, now: float) -> int | None:
        if not window:
            return None
        metric = window[-1]
        if direction == "out":
            target = max(current + 1, math.ceil(current * metric / self.target)) if current else 1
            if now < self._out_until and target <= self._out_reached:
                return None
            return target
        if now < self._in_until or current == 0:
            return None
        target = math.ceil(current * metric / self.target)
        return target if target < current else None

    def applied(self, before: int, after: int, now: float) -> None:
        if after > before:
            self._out_until = now + self.scale_out_cooldown_s
            self._out_reached = after
            self._in_until = -math.inf  # a scale-out ends a scale-in cooldown
        elif after < before:
            self._in_until = now + self.scale_in_cooldown_s


@dataclass
class ScalingActivity:
    time_s: float
    before: int
    after: int
    cause: str


@dataclass
class ScalableTarget:
    """The service's desired count within [minimum, maximum], changed by the policies' proposals."""

    minimum: int
    maximum: int
    read_desired: Callable[[], int]
    write_desired: Callable[[int, str], None]
    activities: list[ScalingActivity] = field(default_factory=list)

    def apply(self, proposals: Sequence[tuple[object, int, str]], now: float) -> None:
        """Apply the largest of this minute's proposals (policy, capacity, cause)."""
        if not proposals:
            return
        current = self.read_desired()
        policy, capacity, cause = max(proposals, key=lambda p: p[1])
        capacity = max(self.minimum, min(self.maximum, capacity))
        if capacity == current:
            return
        self.write_desired(capacity, cause)
        self.activities.append(ScalingActivity(now, current, capacity, cause))
        policy.applied(current, capacity, now)  # type: ignore[attr-defined]
