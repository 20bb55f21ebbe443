"""The policies (SageMaker's documented policy, cdk/queue_scaling.py's) read through the same template reader."""

from __future__ import annotations

import pytest

from bench.scaling.policies import sagemaker_resources
from bench.scaling.template import read_policy
from tests.scaling.conftest import scaling_policy


def test_sagemaker_policy_is_target_tracking_at_five_plus_a_step_from_zero():
    # GIVEN SageMaker's documented policy in ECS terms WHEN read
    spec = read_policy(sagemaker_resources(max_tasks=3))
    # THEN one target tracking policy on backlog per running task at 5, its two generated alarms, and the
    # HasBacklogWithoutCapacity step alarm: 2 of 2 one-minute datapoints, +1 task, 300 s cooldown
    (tracking,) = spec.tracking
    assert tracking.target == 5.0 and tracking.query.expression == "(visible + inFlight) / instances"
    names = {a.name for a in spec.alarms}
    assert {"BacklogTracking-AlarmHigh", "BacklogTracking-AlarmLow", "HasBacklogWithoutCapacityAlarm"} <= names
    alarm = next(a for a in spec.alarms if a.name == "HasBacklogWithoutCapacityAlarm")
    assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.treat_missing) == (2, 2, "missing")
    step = spec.steps["HasBacklogWithoutCapacityScalingPolicy"]
    assert step.step_for(0.0).adjustment == 1 and step.cooldown_s == 300


def _named(spec, prefix):
    """The alarm or step policy whose logical id starts with the construct path's ``prefix``."""
    found = [a for a in spec.alarms if a.name.startswith(prefix)] or [
        p for name, p in spec.steps.items() if name.startswith(prefix)
    ]
    (item,) = found
    return item


def test_queue_scaling_scale_out_adds_the_shortfall_of_tasks():
    # GIVEN QueueScaling with 16 jobs per task on a ceiling of 4 WHEN its scale-out policy sees a shortfall of n
    spec = scaling_policy(max_tasks=4, jobs_per_task=16)
    policy = spec.steps[_named(spec, "ScalingTasksShort").actions[0]]
    # THEN it adds n tasks (the alarm's threshold is a shortfall of 1), at most the ceiling
    assert [policy.step_for(n - 1).adjustment for n in (1, 2, 3, 4, 7)] == [1, 2, 3, 4, 4]


def test_queue_scaling_keep_alive_counts_messages_sent():
    # GIVEN QueueScaling WHEN its idle alarm is read THEN it counts messages sent, so each message restarts it
    spec = scaling_policy(jobs_per_task=16, keep_alive_minutes=3)
    idle = _named(spec, "ScalingIdle")
    assert "sent" in idle.query.stats and idle.query.stats["sent"].stat == "Sum"
    assert (idle.evaluation_periods, idle.treat_missing) == (3, "notBreaching")


def test_trace_loader_refuses_a_csv_without_the_columns(tmp_path):
    # GIVEN a CSV without GeneratedTokens WHEN loaded THEN the error names the missing column
    from bench.scaling.trace import load

    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    with pytest.raises(ValueError, match="GeneratedTokens"):
        load(path)


def test_trace_loader_reads_seven_digit_timestamps_in_order(tmp_path):
    from bench.scaling.trace import load

    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
    )
    requests = load(path)
    assert [r.context_tokens for r in requests] == [374, 396]
    assert requests[1].arrival_s == pytest.approx(4.314579)


def test_tuned_anchors_target_what_one_instance_handles(stack_template):
    # GIVEN the stack (max_num_seqs 135) WHEN the anchors are built THEN each default keeps its documented value and
    # each tuned anchor targets the per-instance capacity: SageMaker's backlog per instance, KEDA's queueLength and
    # QueueProcessing's first step at 135
    from bench.scaling.keda import read_scaled_object
    from bench.scaling.policies import scenarios

    built = {s.name: s for s in scenarios(stack_template, max_tasks=2, keda_spec=read_scaled_object(), cpu_vcpus=4.0)}
    capacity = 135

    def tracking_target(name):
        [tracking] = built[name].policy.tracking
        return tracking.target

    assert (tracking_target("sagemaker_default"), tracking_target("sagemaker_tuned")) == (5.0, capacity)
    assert (built["keda_default"].keda.queue_length, built["keda_tuned"].keda.queue_length) == (5, capacity)

    def first_step(name):
        # the scale-out alarm's threshold: where its first step (+1) starts
        return min(
            a.threshold
            for a in built[name].policy.alarms
            if a.comparison.startswith("Greater") and "MessagesVisible" in a.name
        )

    assert (first_step("queue_processing_default"), first_step("queue_processing_tuned")) == (100, capacity)
