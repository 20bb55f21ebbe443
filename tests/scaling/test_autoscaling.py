"""Application Auto Scaling semantics: step bounds, cooldowns, target tracking's alarms and formula, precedence."""

from __future__ import annotations

from bench.scaling.autoscaling import ScalableTarget, Step, StepPolicy, TargetTrackingPolicy
from bench.scaling.cloudwatch import ALARM, MetricId, MetricQuery, MetricStat, MetricStore, Sources

M = MetricId("Test", "Backlog")


def _scale_out(cooldown: float = 300) -> StepPolicy:
    return StepPolicy("out", "ChangeInCapacity", [Step(0, 99, 1), Step(99, None, 4)], "Maximum", cooldown)


def test_cooldown_blocks_a_second_scale_out_of_the_same_size():
    # GIVEN a +1 step policy with a 300 s cooldown that scaled 0 -> 1 at 60 s
    policy = _scale_out()
    assert policy.propose([5.0], 1, current=0, now=60) == 1
    policy.applied(0, 1, 60)
    # WHEN its alarm invokes it again at 120 s and 300 s THEN nothing (the task it added counts); at 360 s, +1
    assert policy.propose([5.0], 1, current=1, now=120) is None
    assert policy.propose([5.0], 1, current=1, now=300) is None
    assert policy.propose([5.0], 1, current=1, now=360) == 2


def test_a_larger_step_during_cooldown_scales_out_to_base_plus_its_adjustment():
    # GIVEN a scale-out 0 -> 1 in cooldown WHEN the backlog reaches the +4 step THEN the capacity becomes 0 + 4
    policy = _scale_out()
    policy.applied(0, 1, 60)
    assert policy.propose([150.0], 1, current=1, now=120) == 4


def test_scale_in_cooldown_blocks_scale_in_but_not_scale_out():
    # GIVEN a policy that scaled in at 60 s WHEN invoked again at 120 s THEN no further scale-in; a scale-out passes
    policy = StepPolicy("both", "ExactCapacity", [Step(None, 0, 1), Step(0, None, 3)], "Maximum", 300)
    policy.applied(2, 1, 60)
    assert policy.propose([-5.0], 0, current=2, now=120) is None
    assert policy.propose([5.0], 0, current=1, now=120) == 3


def test_step_bounds_on_a_lower_alarm_include_the_threshold():
    # GIVEN the deployed idle step (upper bound 0 -> exactly 0) WHEN the metric equals the threshold THEN it applies
    policy = StepPolicy("idle", "ExactCapacity", [Step(None, 0, 0)], "Maximum")
    assert policy.propose([0.0], 0, current=2, now=0, upper_alarm=False) == 0


def test_target_tracking_scale_in_needs_fifteen_datapoints_below_ninety_percent():
    # GIVEN a target tracking policy at 5 and a metric at 2 from the first minute
    query = MetricQuery({"m1": MetricStat(M, "Average", 60)})
    policy = TargetTrackingPolicy("tt", query, target=5.0)
    high, low = policy.alarms()
    store = MetricStore(Sources({M: lambda: 2.0}))
    states = []
    for minute in range(1, 17):
        store.sample(minute * 60.0)
        high.evaluate(store, minute * 60.0)
        low.evaluate(store, minute * 60.0)
        states.append(low.state)
    # WHEN evaluated each minute THEN its scale-in alarm is in ALARM from the 15th minute, never the scale-out one
    assert states.index(ALARM) == 14 and high.state != ALARM
    assert (low.threshold, low.evaluation_periods) == (4.5, 15)
    # AND it proposes ceil(current x metric / target)
    assert policy.propose("in", [2.0], current=4, now=900) == 2


def test_target_tracking_scale_out_is_proportional_and_cannot_start_from_zero_on_a_per_task_metric():
    policy = TargetTrackingPolicy("tt", MetricQuery({"m1": MetricStat(M, "Average", 60)}), target=5.0)
    assert policy.propose("out", [12.0], current=2, now=0) == 5
    assert policy.propose("out", [], current=0, now=0) is None


def test_the_largest_proposal_wins_and_is_clamped_to_the_maximum():
    # GIVEN two proposals in the same minute WHEN applied THEN the larger, clamped to the target's maximum
    desired = {"n": 1}
    target = ScalableTarget(0, 3, lambda: desired["n"], lambda n, cause: desired.update(n=n))
    a, b = _scale_out(), _scale_out()
    target.apply([(a, 2, "a"), (b, 6, "b")], now=0)
    assert desired["n"] == 3 and target.activities[-1].cause == "b"
