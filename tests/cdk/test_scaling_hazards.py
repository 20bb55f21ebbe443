"""The scaling hazards' fixes and the GPU capacity choices, on the synthesized template (Template.from_stack).

* the wake holds the scaling minimum (the keep-alive alarm re-runs ScaleToZero every minute it stays in ALARM), and
  the maximum too (no second task on a fresh instance while the first starts);
* the keep-alive never reads an unpublished minute as idle;
* the scale-out sets the count it needs rather than adding to a desired count that may not be published yet;
* a warm pool of stopped, pre-initialized instances (tests/cdk/test_warm_pool.py), and the release of empty
  instances, never one with a task.
"""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Match

from async_inference.config import ENV_MODEL_FLEETS, ENV_WAKE_HOLD_S, ENV_WORKER_CLUSTER
from tests.cdk.helpers import role_actions, role_statements


def _function_id(synthesized, function) -> str:
    return synthesized.logical_id(function)


def _role_id(synthesized, function) -> str:
    return synthesized.stack.get_logical_id(function.role.node.default_child)


def test_every_waking_function_holds_the_minimum_for_seven_minutes_and_may(synthesized):
    """GIVEN the functions that wake the workers WHEN reading their environment and role THEN each holds the scaling
    minimum for 420 s (WAKE_HOLD_S) and may RegisterScalableTarget and PutScheduledAction (the hold and its end)."""
    service = synthesized.stack.service
    for function in (service.api.handler, service.uploads.handler, service.batches.controller):
        variables = synthesized.json["Resources"][_function_id(synthesized, function)]["Properties"]["Environment"][
            "Variables"
        ]
        assert variables[ENV_WAKE_HOLD_S] == "420"
        actions = role_actions(synthesized.template, _role_id(synthesized, function))
        assert actions["application-autoscaling:RegisterScalableTarget"] == ["*"]
        assert actions["application-autoscaling:PutScheduledAction"] == ["*"]


def test_every_waking_function_holds_the_maximum_at_what_the_pool_starts_and_knows_what_to_restore(synth_variant):
    """GIVEN a stack of at most 3 tasks with a warm pool of 1 WHEN reading the waking functions' environment THEN the
    model's route in MODEL_FLEETS holds the maximum at 1 task during a hold (worker_hold_max_tasks) and restores 3
    (worker_max_tasks)."""
    variant = synth_variant(max_worker_tasks=3, max_gpu_instances=3)
    service = variant.stack.service
    for function in (service.api.handler, service.uploads.handler, service.batches.controller):
        variables = variant.variables(variant.logical_id(function))
        routes = json.dumps(variables[ENV_MODEL_FLEETS])
        assert '\\"worker_hold_max_tasks\\":1,\\"worker_max_tasks\\":3' in routes, routes


@pytest.mark.parametrize(
    "options",
    [{"gpu_warm_pool_instances": 0}, {"gpu_warm_pool_instances": 2}],
    ids=["no-pool", "pool-starts-every-task"],
)
def test_without_a_pool_or_with_one_that_starts_every_task_the_hold_holds_the_minimum_only(synth_variant, options):
    """GIVEN a stack without a warm pool, or with one of as many instances as its most tasks WHEN reading the waking
    functions' environment THEN none holds the maximum (without a pool a further task comes from a fresh instance
    whenever it is asked for; with a pool that large it comes from the pool at once)."""
    variant = synth_variant(**options)
    service = variant.stack.service
    for function in (service.api.handler, service.uploads.handler, service.batches.controller):
        variables = variant.variables(variant.logical_id(function))
        assert "max_tasks" not in json.dumps(variables[ENV_MODEL_FLEETS])


def test_no_hold_no_permission(synth_variant):
    """GIVEN wake_hold_seconds 0 WHEN synthesized THEN the API function holds nothing and may not change scaling."""
    variant = synth_variant(wake_hold_seconds=0)
    api = variant.stack.service.api.handler
    variables = variant.json["Resources"][variant.logical_id(api)]["Properties"]["Environment"]["Variables"]
    assert variables[ENV_WAKE_HOLD_S] == "0"
    actions = role_actions(variant.template, variant.stack.get_logical_id(api.role.node.default_child))
    assert not any(a.startswith("application-autoscaling:") for a in actions)


def test_keep_alive_never_reads_an_unpublished_minute_as_idle(synthesized):
    """GIVEN the keep-alive alarm WHEN reading it THEN no queue metric is FILLed (only the learned keep-alive's
    decision, whose absence is the fixed keep-alive) and missing data is not breaching: a queue SQS does not publish
    (inactive, or resuming for up to 15 minutes) never reads as idle."""
    alarm = synthesized.stack.service.fleets[0].scaling.idle_alarm
    properties = synthesized.json["Resources"][synthesized.logical_id(alarm)]["Properties"]
    [expression] = [m["Expression"] for m in properties["Metrics"] if "Expression" in m]
    assert expression.count("FILL") == expression.count("FILL(keepWarm, 0)") == 1
    assert properties["TreatMissingData"] == "notBreaching"


def test_scale_out_sets_a_count_never_adds_one(synthesized):
    """GIVEN the scale-out alarm's policy WHEN reading it THEN it is ExactCapacity whose steps set 1..max tasks from
    the tasks needed (the alarm's metric), so an unpublished DesiredTaskCount cannot double a cold start's task."""
    scaling = synthesized.stack.service.fleets[0].scaling
    alarm = synthesized.json["Resources"][synthesized.logical_id(scaling.scale_out_alarm)]["Properties"]
    [policy_ref] = alarm["AlarmActions"]
    policy = synthesized.json["Resources"][policy_ref["Ref"]]["Properties"]["StepScalingPolicyConfiguration"]
    assert policy["AdjustmentType"] == "ExactCapacity"
    assert [s["ScalingAdjustment"] for s in policy["StepAdjustments"]] == [1, 2]


def test_warm_pool_keeps_stopped_instances(synthesized):
    """GIVEN the GPU group WHEN synthesized THEN a warm pool keeps one instance Stopped, an absolute size (MinSize =
    MaxGroupPreparedCapacity; without ReuseOnScaleIn: tests/cdk/test_warm_pool.py); the ECS agent waits out the pool's
    initialization; vLLM's compile cache lives on the weights' volume."""
    workers = synthesized.stack.service.fleets[0].workers
    synthesized.template.has_resource_properties(
        "AWS::AutoScaling::WarmPool",
        {
            "AutoScalingGroupName": {"Ref": synthesized.logical_id(workers.auto_scaling_group)},
            "MinSize": 1,
            "MaxGroupPreparedCapacity": 1,
            "PoolState": "Stopped",
        },
    )
    [launch] = synthesized.resources("AWS::EC2::LaunchTemplate").values()
    assert "ECS_WARM_POOLS_CHECK=true" in json.dumps(launch["Properties"]["LaunchTemplateData"]["UserData"])
    assert synthesized.worker_environment()["VLLM_CACHE_ROOT"].startswith("/models/")


def test_a_larger_pool_when_asked_for_keeps_its_absolute_size(synth_variant):
    """GIVEN gpu_warm_pool_instances 2 WHEN synthesized THEN the pool's MinSize and MaxGroupPreparedCapacity are both 2."""
    synth_variant(gpu_warm_pool_instances=2).template.has_resource_properties(
        "AWS::AutoScaling::WarmPool", {"MinSize": 2, "MaxGroupPreparedCapacity": 2}
    )


def test_no_warm_pool_when_asked_for_none(synth_variant):
    """GIVEN gpu_warm_pool_instances 0 WHEN synthesized THEN there is no warm pool."""
    synth_variant(gpu_warm_pool_instances=0).template.resource_count_is("AWS::AutoScaling::WarmPool", 0)


def test_empty_instances_are_released_every_minute_by_protection_and_count_never_by_instance(synthesized):
    """GIVEN the instance release WHEN reading its schedule and role THEN it runs every minute on this cluster and
    group, may drain this cluster's instances, lift protection and lower the group's desired capacity, and may not
    terminate an instance by id (the group's scale-in picks among unprotected instances only; ECS protects every
    instance that runs a task)."""
    capacity = synthesized.stack.service.fleets[0].capacity
    function = capacity.release_function
    function_id = _function_id(synthesized, function)
    synthesized.template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": "rate(1 minute)",
            "Targets": Match.array_with([Match.object_like({"Arn": {"Fn::GetAtt": [function_id, "Arn"]}})]),
        },
    )
    variables = synthesized.json["Resources"][function_id]["Properties"]["Environment"]["Variables"]
    workers = synthesized.stack.service.fleets[0].workers
    group_id = synthesized.logical_id(workers.auto_scaling_group)
    assert variables[ENV_WORKER_CLUSTER] == {"Ref": synthesized.logical_id(workers.cluster)}
    actions = role_actions(synthesized.template, _role_id(synthesized, function))
    for action in ("autoscaling:SetInstanceProtection", "autoscaling:SetDesiredCapacity"):
        assert group_id in json.dumps(actions[action])
    assert "ecs:UpdateContainerInstancesState" in actions
    assert not any("Terminate" in a for a in actions)


def test_capacity_provider_keeps_managed_termination_protection(synthesized):
    """GIVEN the release WHEN the capacity provider is read THEN managed termination protection stays on (ECS
    protects an instance before it places a task there), which the release relies on."""
    synthesized.template.has_resource_properties(
        "AWS::ECS::CapacityProvider",
        {"AutoScalingGroupProvider": Match.object_like({"ManagedTerminationProtection": "ENABLED"})},
    )
    synthesized.template.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup", {"NewInstancesProtectedFromScaleIn": True}
    )


def test_the_instance_release_may_read_this_clusters_services_only(synthesized):
    """GIVEN the instance release, which releases nothing while a service of the cluster has tasks to place WHEN
    reading its role THEN it may list the services of this cluster only (ecs:cluster condition) and describe this
    cluster's services."""
    workers = synthesized.stack.service.fleets[0].workers
    function = synthesized.stack.service.fleets[0].capacity.release_function
    cluster = {"Fn::GetAtt": [synthesized.logical_id(workers.cluster), "Arn"]}
    statements = role_statements(synthesized.template, _role_id(synthesized, function))
    [listing] = [s for s in statements if s["Action"] == "ecs:ListServices"]
    assert listing["Condition"] == {"ArnEquals": {"ecs:cluster": cluster}}
    [describing] = [s for s in statements if s["Action"] == "ecs:DescribeServices"]
    resource = json.dumps(describing["Resource"])
    assert ":service/" in resource and synthesized.logical_id(workers.cluster) in resource
