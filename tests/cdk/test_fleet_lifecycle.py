"""Deploy day (issue 27, findings 3 and 4): the worker service waits for no GPU at create, and a delete lifts the
scale-in protections that would keep it waiting."""

from __future__ import annotations

import json
from typing import Any

import pytest

from async_inference.fleet_deploy_steps import (
    DESIRED_COUNT,
    DESIRED_COUNT_ATTRIBUTE,
    INSTANCE_PROTECTION_RELEASE,
    TASK_PROTECTION_RELEASE,
)
from tests.cdk.helpers import function_role, role_actions
from tests.cdk.test_model_fleets import MODELS

pytestmark = pytest.mark.cdk

STEPS = "lambdas.fleet_deploy_steps.handler.lambda_handler"

TWO_MODELS = {"models": json.dumps(MODELS)}


def _depends_on(resource: dict[str, Any]) -> set[str]:
    depends = resource.get("DependsOn", [])
    return {depends} if isinstance(depends, str) else set(depends)


def _one(resources: dict[str, dict[str, Any]], **properties: Any) -> tuple[str, dict[str, Any]]:
    found = [
        (lid, r) for lid, r in resources.items() if all(r["Properties"].get(k) == v for k, v in properties.items())
    ]
    assert len(found) == 1, f"expected one resource with {properties}, found {[lid for lid, _ in found]}"
    return found[0]


@pytest.fixture(scope="module")
def two_fleets(synth_variant):
    return synth_variant(**TWO_MODELS)


def test_each_worker_service_is_created_at_zero_tasks_and_keeps_its_count_on_updates(two_fleets):
    """GIVEN two models' fleets WHEN synthesized THEN each ECS service's DesiredCount is the attribute of a
    Custom::WorkerDesiredCount that names that service and its task definition (0 at create, the service's own count
    on later deploys), never absent (CloudFormation's 1, which waits for a GPU task) nor a literal (reset on updates)."""
    services = two_fleets.resources("AWS::ECS::Service")
    counts = two_fleets.resources(DESIRED_COUNT)
    assert len(services) == 2 and len(counts) == 2
    for service in services.values():
        properties = service["Properties"]
        count_id, attribute = properties["DesiredCount"]["Fn::GetAtt"]
        assert attribute == DESIRED_COUNT_ATTRIBUTE
        count = counts[count_id]["Properties"]
        assert count["Service"] == properties["ServiceName"] and count["Cluster"] == properties["Cluster"]
        assert count["TaskDefinition"] == properties["TaskDefinition"]


def test_a_delete_lifts_task_protection_before_each_service_goes(two_fleets):
    """GIVEN two fleets WHEN synthesized THEN each service has a Custom::WorkerTaskProtectionRelease naming it that
    depends on it (so CloudFormation deletes the release, which lifts the tasks' protection, before the service)."""
    releases = two_fleets.resources(TASK_PROTECTION_RELEASE)
    services = two_fleets.resources("AWS::ECS::Service")
    assert len(releases) == len(services) == 2
    for service_id, service in services.items():
        _, release = _one(releases, Service=service["Properties"]["ServiceName"])
        assert service_id in _depends_on(release)


def test_a_delete_lifts_instance_protection_after_the_capacity_provider_and_before_the_group(two_fleets):
    """GIVEN two fleets WHEN synthesized THEN each GPU group has a Custom::GpuInstanceProtectionRelease that refers
    to it (deleted before the group) and that its capacity provider depends on (deleted after the provider, when
    nothing protects the instances again)."""
    releases = two_fleets.resources(INSTANCE_PROTECTION_RELEASE)
    providers = two_fleets.resources("AWS::ECS::CapacityProvider")
    groups = two_fleets.resources("AWS::AutoScaling::AutoScalingGroup")
    assert len(releases) == len(providers) == len(groups) == 2
    for provider in providers.values():
        group_id = provider["Properties"]["AutoScalingGroupProvider"]["AutoScalingGroupArn"]["Ref"]
        release_id, _ = _one(releases, Group={"Ref": group_id})
        assert release_id in _depends_on(provider)


def test_the_steps_function_may_lift_protections_on_the_stacks_own_fleets_only(two_fleets):
    """GIVEN the steps function WHEN reading its role THEN it may update task protection on the cluster's tasks and
    instance protection on each GPU group by name, and update only the two worker services."""
    actions = role_actions(two_fleets.template, function_role(two_fleets.template, STEPS))
    [tasks] = actions["ecs:UpdateTaskProtection"]
    assert ":task/" in str(tasks)
    assert len(actions["autoscaling:SetInstanceProtection"]) == 2
    services = {str(r) for r in actions["ecs:UpdateService"]}
    assert len(services) == 2 and all(":service/" in s for s in services)
