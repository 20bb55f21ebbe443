"""The simulator's view of the synthesized stack: the deployed policy, wake and worker read from the template, not
re-typed, and equal to what the stack's options deploy."""

from __future__ import annotations

import copy
import json

import pytest

from async_inference import config as env
from async_inference import settings
from bench.scaling.cloudwatch import evaluate_expression
from bench.scaling.counterfactuals import without as _without
from bench.scaling.keda import read_scaled_object
from bench.scaling.policies import scenarios
from bench.scaling.template import TemplateError, WakeSpec, read, read_policy
from cdk.options import AsyncInferenceServiceProps
from tests.scaling.conftest import cdk_json_context

pytestmark = pytest.mark.cdk
CONTEXT = cdk_json_context()
PROPS = AsyncInferenceServiceProps()  # cdk.json sets none of the scaling options: their defaults are deployed
J = PROPS.effective_jobs_per_task()
# The job queue (1) and the batch lane (2, a chunk of BATCH_CHUNK_LINES lines), each FILLed: an idle lane publishes
# no datapoints.
BACKLOG = (
    f"(FILL(visible1, 0) + FILL(inFlight1, 0) + "
    f"{settings.BATCH_CHUNK_LINES} * (FILL(visible2, 0) + FILL(inFlight2, 0)))"
)


def _alarm(spec, name: str):
    (alarm,) = [a for a in spec.alarms if name in a.name]
    return alarm


def test_scalable_target_bounds_are_the_configured_task_limits(stack_template):
    # GIVEN the synthesized stack WHEN the reader reads it THEN the task count may go from 0 to max_worker_tasks
    policy = read(stack_template).policy
    assert (policy.minimum, policy.maximum) == (0, CONTEXT["max_worker_tasks"])


def test_scale_out_reads_back_as_the_tasks_the_backlog_needs_set_exactly(stack_template):
    # GIVEN the stack WHEN its scale-out alarm and policy are read
    spec = read(stack_template).policy
    alarm = _alarm(spec, "TasksShort")
    # THEN the simulator evaluates n = CEIL(backlog / J), when n - FILL(desired, 0) >= 1, on one minute of Maximum
    # datapoints
    needed = f"CEIL({BACKLOG} / {J:g})"
    assert alarm.query.expression == f"IF({needed} - FILL(desired, 0) >= 1, {needed}, 0)"
    assert {
        k: (s.metric.namespace, s.metric.name, s.stat, s.period_s, bool(s.metric.resource))
        for k, s in alarm.query.stats.items()
    } == {
        **{
            f"{name}{i}": ("AWS/SQS", metric, "Maximum", 60, i == 2)  # 2: the batch lane, which the trace leaves idle
            for i in (1, 2)
            for name, metric in (
                ("visible", "ApproximateNumberOfMessagesVisible"),
                ("inFlight", "ApproximateNumberOfMessagesNotVisible"),
            )
        },
        "desired": ("ECS/ContainerInsights", "DesiredTaskCount", "Maximum", 60, False),
    }
    assert (alarm.threshold, alarm.comparison, alarm.evaluation_periods, alarm.treat_missing) == (
        1,
        "GreaterThanOrEqualToThreshold",
        1,
        "notBreaching",
    )
    policy = spec.steps[alarm.actions[0]]
    assert (policy.adjustment_type, policy.cooldown_s) == ("ExactCapacity", PROPS.scale_out_cooldown_seconds)
    # n tasks needed (n - 1 above the threshold) sets n, up to the ceiling
    assert [policy.step_for(n - 1).adjustment for n in (1, 2, 5)] == [1, 2, CONTEXT["max_worker_tasks"]]


def test_step_down_reads_back_at_half_fill_for_three_minutes_one_task_at_a_time(stack_template):
    spec = read(stack_template).policy
    alarm = _alarm(spec, "TasksSpare")
    spare = J * PROPS.scale_in_fill
    assert alarm.query.expression == (f"FILL(desired, 0) - IF({BACKLOG} > 0, CEIL({BACKLOG} / {spare:g}), 1)")
    minutes = PROPS.scale_in_minutes
    assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.treat_missing) == (minutes, minutes, "missing")
    policy = spec.steps[alarm.actions[0]]
    assert (policy.adjustment_type, policy.cooldown_s) == ("ChangeInCapacity", PROPS.scale_in_cooldown_seconds)
    assert policy.step_for(0.0).adjustment == -1


def test_keep_alive_reads_back_as_nothing_visible_in_flight_or_sent_then_zero(stack_template):
    # GIVEN the stack WHEN its keep-alive is read THEN it sums every queue's metrics unfilled (a minute any queue did
    # not publish is missing, not idle) and the learned keep-alive's decision, and treats missing data as not breaching
    spec = read(stack_template).policy
    alarm = _alarm(spec, "Idle")
    assert alarm.query.expression == (
        " + ".join(f"{m}{i}" for i in (1, 2) for m in ("visible", "inFlight", "sent")) + " + FILL(keepWarm, 0)"
    )
    assert alarm.query.stats["sent1"].stat == "Sum"
    assert alarm.query.stats["sent1"].metric.resource == "" and alarm.query.stats["sent2"].metric.resource  # the lane
    minutes = PROPS.idle_minutes_before_scale_in
    assert (alarm.evaluation_periods, alarm.datapoints_to_alarm, alarm.treat_missing) == (
        minutes,
        minutes,
        "notBreaching",
    )
    policy = spec.steps[alarm.actions[0]]
    assert policy.adjustment_type == "ExactCapacity"
    assert policy.step_for(0.0, upper_alarm=False).adjustment == 0
    assert len(spec.alarms) == 3 and not spec.tracking


def test_the_learned_keep_alive_reads_back_as_the_policy_its_function_runs(stack_template):
    # GIVEN the stack WHEN read THEN the keep-alive function's policy: a job-second of waiting priced at 1/J GPU-seconds,
    # the alarm's own minutes as the fixed keep-alive, and the simulator's deployed scenario runs it
    deployed = read(stack_template)
    minutes = PROPS.idle_minutes_before_scale_in
    assert deployed.keep_alive is not None
    assert deployed.keep_alive.wait_price == pytest.approx(1 / J)
    assert deployed.keep_alive.alarm_s == deployed.keep_alive.fallback_s == minutes * 60
    [scenario] = scenarios(
        stack_template, max_tasks=2, keda_spec=read_scaled_object(), cpu_vcpus=4.0, only=("deployed",)
    )
    assert scenario.keep_alive == deployed.keep_alive


def test_a_keep_alive_function_that_may_not_publish_decides_nothing(stack_template):
    # GIVEN the stack with the keep-alive function's PutMetricData statement removed WHEN read THEN no learned
    # keep-alive: its decision would never reach the alarm, which FILLs it as 0
    variant = copy.deepcopy(stack_template)
    for resource in variant["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        statements = resource["Properties"]["PolicyDocument"]["Statement"]
        statements[:] = [s for s in statements if s["Action"] != "cloudwatch:PutMetricData"]
    assert read(variant).keep_alive is None


def test_capacity_and_worker_settings_come_from_the_template(stack_template):
    # GIVEN the stack WHEN the reader reads capacity and the worker THEN it finds the group's limit, managed scaling's
    # target and 120 s warm-up, the sized batch, the model, host volume for weights and the protection marker
    deployed = read(stack_template)
    assert deployed.cluster.max_instances == CONTEXT["max_gpu_instances"]
    assert (deployed.cluster.target_capacity, deployed.cluster.instance_warmup_s) == (100, 120)
    assert deployed.cluster.weights_on_host and deployed.cluster.uses_task_protection
    assert deployed.worker.max_num_seqs == PROPS.effective_max_num_seqs() == 135
    assert deployed.worker.model == CONTEXT["model"]
    assert deployed.worker.instance_type == CONTEXT["gpu_instance_type"]
    assert deployed.worker.stop_timeout_s == 120
    assert (deployed.worker.task_protection, deployed.worker.task_protection_tokens_per_s) == ("long_jobs", 20.0)


def test_the_wake_reads_back_as_the_functions_that_queue_jobs_once_a_minute(stack_template):
    # GIVEN the stack WHEN the reader looks for functions that may set the worker service's count THEN it finds the
    # functions that queue work: the API and its streaming function (lambdas/api/run.sh under the Web Adapter), the
    # upload and the batch controller functions (a MODEL_FLEETS route naming
    # the service, ecs:UpdateService on it), at 60 s, each holding the service at one task for the wake hold (minimum
    # and maximum: the route's worker_hold_max_tasks) and starting the GPU instance (the route's worker_group naming
    # the group, autoscaling:SetDesiredCapacity on it)
    wake = read(stack_template).wake
    handlers = {
        lid: f["Properties"]["Handler"]
        for lid, f in stack_template["Resources"].items()
        if lid in (wake.functions if wake else ())
    }
    assert wake == WakeSpec(
        functions=tuple(sorted(handlers)),
        check_interval_s=PROPS.wake_check_interval_seconds,
        hold_s=PROPS.wake_hold_seconds,
        starts_instance=True,
        hold_max_tasks=1,
    )
    assert sorted(handlers.values()) == [
        "lambdas.api.handler.lambda_handler",
        "lambdas.batch_controller.handler.lambda_handler",
        "lambdas.upload.handler.lambda_handler",
        "lambdas/api/run.sh",
    ]


def test_the_simulators_deployed_scenario_is_what_the_template_says(stack_template):
    # GIVEN the stack WHEN the simulator builds its scenarios THEN "deployed" wakes at the template's interval and
    # hold, runs long_jobs protection at its rate, the capacity provider's warm-up, the warm pool and the release; the
    # anchors, each at its default and its tuning, keep ECS's 300 s, no pool, no release and no protection
    deployed, *anchors = scenarios(
        stack_template, max_tasks=CONTEXT["max_worker_tasks"], keda_spec=read_scaled_object(), cpu_vcpus=4.0
    )
    assert deployed.name == "deployed" and deployed.api_wake is not None
    assert (deployed.api_wake.check_interval_s, deployed.api_wake.hold_s) == (60, PROPS.wake_hold_seconds)
    assert deployed.api_wake.starts_instance and deployed.api_wake.hold_max_tasks == 1
    assert (deployed.task_protection, deployed.protection_tokens_per_s, deployed.instance_warmup_s) == (
        "long_jobs",
        20.0,
        120,
    )
    assert (deployed.warm_pool, deployed.release_empty) == (1, True)
    assert read_policy(stack_template).alarms == deployed.policy.alarms
    assert {
        (a.name, a.task_protection, a.instance_warmup_s, a.api_wake, a.warm_pool, a.release_empty) for a in anchors
    } == {
        (f"{name}_{kind}", "off", 300, None, 0, False)
        for name in ("queue_processing", "sagemaker", "keda")
        for kind in ("default", "tuned")
    }


def test_the_instance_start_reads_back_only_with_the_group_named_and_the_permission_on_it(stack_template):
    # GIVEN the stack with the group's name taken out of every waking function's routes
    variant = _without(stack_template, "instance_start")
    # WHEN read THEN the wake no longer starts the instance (managed scaling does, a minute later)
    assert read(stack_template).wake.starts_instance and not read(variant).wake.starts_instance


def test_the_hold_reads_as_holding_the_maximum_only_when_the_functions_know_it(stack_template):
    # GIVEN the stack with the hold's maxima taken out of every waking function's routes
    variant = _without(stack_template, "hold_cap")
    # WHEN read THEN a wake's hold raises the minimum only (a scale-out may add a task while the first starts)
    assert (read(stack_template).wake.hold_max_tasks, read(variant).wake.hold_max_tasks) == (1, None)


def test_the_pool_reads_as_pre_initialized_only_with_the_launch_hook_and_the_user_data_that_pulls(stack_template):
    # GIVEN the stack WHEN read THEN its warm pool is pre-initialized (a launch hook on the group, user data that
    # pulls the image and completes the hook)
    assert read(stack_template).cluster.pool_pre_initialized is True
    # AND without the hook it is not, and that reaches the deployed scenario
    variant = copy.deepcopy(stack_template)
    variant["Resources"] = {
        k: v for k, v in variant["Resources"].items() if v["Type"] != "AWS::AutoScaling::LifecycleHook"
    }
    [deployed] = scenarios(variant, max_tasks=2, keda_spec=read_scaled_object(), cpu_vcpus=4.0, only=("deployed",))
    assert read(variant).cluster.pool_pre_initialized is False and deployed.pool_pre_initialized is False
    # AND with the hook but user data that pulls nothing it is not either
    variant = copy.deepcopy(stack_template)
    for resource in variant["Resources"].values():
        if resource["Type"] == "AWS::EC2::LaunchTemplate":
            resource["Properties"]["LaunchTemplateData"]["UserData"] = {"Fn::Base64": "#!/bin/bash\necho hello"}
    assert read(variant).cluster.pool_pre_initialized is False


def test_a_pool_that_sets_reuse_on_scale_in_is_refused(stack_template):
    # GIVEN the stack's warm pool with ReuseOnScaleIn, which the ECS guide says cannot be set for a group used by ECS
    variant = copy.deepcopy(stack_template)
    for resource in variant["Resources"].values():
        if resource["Type"] == "AWS::AutoScaling::WarmPool":
            resource["Properties"]["InstanceReusePolicy"] = {"ReuseOnScaleIn": True}
    # WHEN read THEN the reader refuses it, naming the pool and the rule
    with pytest.raises(TemplateError, match=r"WarmPool\w*: ReuseOnScaleIn cannot be set for a group used by ECS"):
        read(variant)


def test_the_pool_size_is_read_as_put_warm_pool_defines_it(stack_template):
    # GIVEN the stack's warm pool (MinSize and MaxGroupPreparedCapacity 1) in a group of MaxSize 2
    def pool_with(**props: int) -> tuple[int, int | None]:
        variant = copy.deepcopy(stack_template)
        for resource in variant["Resources"].values():
            if resource["Type"] == "AWS::AutoScaling::WarmPool":
                resource["Properties"].pop("MaxGroupPreparedCapacity", None)
                resource["Properties"].update(props)
        cluster = read(variant).cluster
        return cluster.warm_pool, cluster.pool_min_size

    # WHEN read THEN the pool holds MAX(MinSize, MaxGroupPreparedCapacity - in service), the group's MaxSize standing
    # for a MaxGroupPreparedCapacity not set (or -1): at zero in service, the larger of the two
    assert read(stack_template).cluster.warm_pool == 1
    assert pool_with(MinSize=1, MaxGroupPreparedCapacity=1) == (1, 1)
    assert pool_with(MinSize=1) == (2, 1)  # not 1: without MaxGroupPreparedCapacity the pool fills to MaxSize
    assert pool_with(MinSize=0, MaxGroupPreparedCapacity=-1) == (2, 0)
    assert pool_with(MinSize=0, MaxGroupPreparedCapacity=1) == (1, 0)


def test_a_function_that_names_the_service_without_permission_to_update_it_is_refused(stack_template):
    # GIVEN the template with the ECS statements taken out of every policy
    template = copy.deepcopy(stack_template)
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy":
            document = resource["Properties"]["PolicyDocument"]
            document["Statement"] = [s for s in document["Statement"] if "ecs:UpdateService" not in json.dumps(s)]
    # WHEN read THEN the reader refuses, naming the function: such a wake would fail at every check
    with pytest.raises(TemplateError, match=r"Service\w+: its MODEL_FLEETS route names .* may not ecs:UpdateService"):
        read(template)


def test_task_protection_reads_as_off_when_the_marker_says_so_or_the_role_may_not_set_it(stack_template):
    template = copy.deepcopy(stack_template)
    [task] = [r for r in template["Resources"].values() if r["Type"] == "AWS::ECS::TaskDefinition"]
    environment = task["Properties"]["ContainerDefinitions"][0]["Environment"]
    next(e for e in environment if e["Name"] == env.ENV_TASK_PROTECTION)["Value"] = "busy"
    assert read(template).worker.task_protection == "busy"
    next(e for e in environment if e["Name"] == env.ENV_TASK_PROTECTION)["Value"] = "off"
    assert read(template).worker.task_protection == "off" and not read(template).cluster.uses_task_protection
    next(e for e in environment if e["Name"] == env.ENV_TASK_PROTECTION)["Value"] = "sometimes"
    with pytest.raises(TemplateError, match="TASK_PROTECTION is 'sometimes'"):
        read(template)


def test_reader_refuses_a_template_without_an_ecs_scalable_target():
    # GIVEN resources without a ScalableTarget WHEN read THEN the error names what is missing
    with pytest.raises(TemplateError, match="ScalableTarget"):
        read_policy({"Resources": {}})


def test_an_idle_lane_publishing_nothing_does_not_blank_the_scale_out_alarm(stack_template):
    # GIVEN the deployed scale-out alarm, jobs waiting in the job queue, and a batch lane idle for hours (SQS publishes
    # no datapoints for it at all)
    alarm = _alarm(read(stack_template).policy, "TasksShort")
    values = {"visible1": 30.0, "inFlight1": 0.0, "visible2": None, "inFlight2": None, "desired": None}
    # WHEN CloudWatch evaluates it THEN it still asks for a task: each queue's terms are FILLed
    assert evaluate_expression(alarm.query.expression, values) == 1
    # (without FILL, the lane's missing datapoints would blank the sum, and the fleet would never wake on the alarm)
    unfilled = alarm.query.expression.replace("FILL(visible2, 0)", "visible2").replace(
        "FILL(inFlight2, 0)", "inFlight2"
    )
    assert evaluate_expression(unfilled, values) is None
