"""The simulator's view of the synthesized stack: the deployed policy read from the template, not re-typed."""

from __future__ import annotations

import pytest

from bench.scaling.template import TemplateError, read, read_policy
from cdk.service import AsyncInferenceServiceProps
from tests.scaling.conftest import cdk_json_context

pytestmark = pytest.mark.cdk
CONTEXT = cdk_json_context()
PROPS = AsyncInferenceServiceProps()


def test_scalable_target_bounds_are_the_configured_task_limits(stack_template):
    # GIVEN the synthesized stack WHEN the reader reads it THEN the task count may go from 0 to max_worker_tasks
    policy = read(stack_template).policy
    assert (policy.minimum, policy.maximum) == (0, CONTEXT["max_worker_tasks"])


def test_scale_out_alarm_is_one_minute_of_visible_messages_missing_as_not_breaching(stack_template):
    # GIVEN the stack WHEN its scale-out alarm is read THEN it watches the maximum of visible messages each minute
    alarm = next(a for a in read(stack_template).policy.alarms if a.comparison == "GreaterThanOrEqualToThreshold")
    (stat,) = alarm.query.stats.values()
    assert (stat.metric.name, stat.stat, stat.period_s) == ("ApproximateNumberOfMessagesVisible", "Maximum", 60)
    assert (alarm.threshold, alarm.evaluation_periods, alarm.treat_missing) == (1, 1, "notBreaching")


def test_scale_out_steps_read_back_as_the_props_steps(stack_template):
    # GIVEN the default scale_out_steps WHEN the step policy behind the scale-out alarm is read
    spec = read(stack_template).policy
    alarm = next(a for a in spec.alarms if a.comparison == "GreaterThanOrEqualToThreshold")
    policy = spec.steps[alarm.actions[0]]
    # THEN each (visible messages, tasks added) pair is a step starting at its threshold, with the 300 s cooldown
    first = PROPS.scale_out_steps[0][0]
    for threshold, tasks in PROPS.scale_out_steps:
        step = policy.step_for(threshold - first)
        assert step is not None and step.adjustment == tasks
    assert (policy.adjustment_type, policy.cooldown_s) == ("ChangeInCapacity", 300)


def test_idle_alarm_is_metric_math_over_visible_and_in_flight_for_the_idle_minutes(stack_template):
    # GIVEN the stack WHEN its scale-in alarm is read THEN it sums visible and in-flight messages for 10 minutes,
    # missing data counting as idle, and sets the count to exactly 0
    spec = read(stack_template).policy
    alarm = next(a for a in spec.alarms if a.comparison == "LessThanOrEqualToThreshold")
    assert alarm.query.expression == "visible + inFlight"
    assert {s.metric.name for s in alarm.query.stats.values()} == {
        "ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible"}
    minutes = CONTEXT["idle_minutes_before_scale_in"]
    assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.treat_missing) == (minutes, minutes, "breaching")
    policy = spec.steps[alarm.actions[0]]
    assert policy.adjustment_type == "ExactCapacity"
    assert policy.step_for(0.0, upper_alarm=False).adjustment == 0


def test_capacity_and_worker_settings_come_from_the_template(stack_template):
    # GIVEN the stack WHEN the reader reads capacity and the worker THEN it finds the group's limit, managed scaling's
    # target, the task definition's batch, model, host volume for weights and task protection permission
    deployed = read(stack_template)
    assert deployed.cluster.max_instances == CONTEXT["max_gpu_instances"]
    assert deployed.cluster.target_capacity == 100
    assert deployed.cluster.weights_on_host and deployed.cluster.uses_task_protection
    assert deployed.worker.max_num_seqs == CONTEXT["max_num_seqs"]
    assert deployed.worker.model == CONTEXT["model"]
    assert deployed.worker.instance_type == CONTEXT["gpu_instance_type"]
    assert deployed.worker.stop_timeout_s == 120


def test_reader_refuses_a_template_without_an_ecs_scalable_target():
    # GIVEN resources without a ScalableTarget WHEN read THEN the error names what is missing
    with pytest.raises(TemplateError, match="ScalableTarget"):
        read_policy({"Resources": {}})
