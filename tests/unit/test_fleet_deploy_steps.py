"""The GPU fleets' custom resource steps (async_inference.fleet_deploy_steps) against moto's ECS and Auto Scaling,
and a small ECS fake where moto has no tasks (a service's tasks and their scale-in protection)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from async_inference.fleet_deploy_steps import (
    DESIRED_COUNT,
    DESIRED_COUNT_ATTRIBUTE,
    INSTANCE_PROTECTION_RELEASE,
    TASK_PROTECTION_RELEASE,
    handle,
)

REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield boto3.client("ecs", region_name=REGION), boto3.client("autoscaling", region_name=REGION)


def _event(resource_type: str, request: str, **props: Any) -> dict[str, Any]:
    return {"ResourceType": resource_type, "RequestType": request, "ResourceProperties": props}


def _service(ecs: Any, desired: int) -> None:
    ecs.create_cluster(clusterName="c")
    ecs.register_task_definition(family="w", containerDefinitions=[{"name": "w", "image": "i", "memory": 512}])
    ecs.create_service(cluster="c", serviceName="gpu-workers", taskDefinition="w", desiredCount=desired)


def test_a_new_service_gets_zero_tasks(aws):
    # GIVEN a stack being created: the service does not exist yet
    ecs, autoscaling = aws
    # WHEN CloudFormation creates the desired-count resource THEN it answers 0
    result = handle(
        _event(DESIRED_COUNT, "Create", Cluster="c", Service="gpu-workers"), ecs=ecs, autoscaling=autoscaling
    )
    assert result.data == {DESIRED_COUNT_ATTRIBUTE: 0}


def test_an_update_keeps_the_count_scaling_set(aws):
    # GIVEN a service that scaling set to 3 tasks
    ecs, autoscaling = aws
    _service(ecs, 3)
    # WHEN a deploy updates the desired-count resource (a new task definition) THEN it answers 3, not 0
    result = handle(
        _event(DESIRED_COUNT, "Update", Cluster="c", Service="gpu-workers"), ecs=ecs, autoscaling=autoscaling
    )
    assert result.data == {DESIRED_COUNT_ATTRIBUTE: 3}


def test_a_stack_upgraded_to_this_resource_keeps_its_running_count(aws):
    # GIVEN a stack deployed before the resource existed: its service runs 2 tasks
    ecs, autoscaling = aws
    _service(ecs, 2)
    # WHEN the deploy that adds the resource creates it THEN it answers 2 (0 would stop both tasks)
    result = handle(
        _event(DESIRED_COUNT, "Create", Cluster="c", Service="gpu-workers"), ecs=ecs, autoscaling=autoscaling
    )
    assert result.data == {DESIRED_COUNT_ATTRIBUTE: 2}


def test_the_physical_id_is_stable_across_create_and_update(aws):
    # GIVEN the same properties WHEN created then updated THEN the physical id is the same (no replacement)
    ecs, autoscaling = aws
    _service(ecs, 1)
    props = {"Cluster": "c", "Service": "gpu-workers"}
    create = handle(_event(DESIRED_COUNT, "Create", **props), ecs=ecs, autoscaling=autoscaling)
    update = handle(_event(DESIRED_COUNT, "Update", **props), ecs=ecs, autoscaling=autoscaling)
    assert create.physical_id == update.physical_id


def _protected_group(autoscaling: Any, instances: int) -> None:
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    autoscaling.create_launch_configuration(
        LaunchConfigurationName="lc", ImageId="ami-12c6146b", InstanceType="g5.xlarge"
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="gpu",
        LaunchConfigurationName="lc",
        MinSize=0,
        MaxSize=4,
        DesiredCapacity=instances,
        VPCZoneIdentifier=subnet,
        NewInstancesProtectedFromScaleIn=True,
    )


def test_a_delete_lifts_every_instances_scale_in_protection(aws):
    # GIVEN a GPU group whose two instances ECS managed termination protection left protected
    ecs, autoscaling = aws
    _protected_group(autoscaling, 2)
    # WHEN the stack deletes the instance protection release
    result = handle(_event(INSTANCE_PROTECTION_RELEASE, "Delete", Group="gpu"), ecs=ecs, autoscaling=autoscaling)
    # THEN both instances were released and none is protected any more (the group's delete can terminate them)
    [group] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu"])["AutoScalingGroups"]
    assert len(result.released) == 2
    assert [i["ProtectedFromScaleIn"] for i in group["Instances"]] == [False, False]


def test_creating_the_instance_protection_release_changes_nothing(aws):
    # GIVEN a protected group WHEN the release is created (a deploy) THEN its instances stay protected
    ecs, autoscaling = aws
    _protected_group(autoscaling, 1)
    handle(_event(INSTANCE_PROTECTION_RELEASE, "Create", Group="gpu"), ecs=ecs, autoscaling=autoscaling)
    [group] = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["gpu"])["AutoScalingGroups"]
    assert [i["ProtectedFromScaleIn"] for i in group["Instances"]] == [True]


class _EcsWithTasks:
    """ECS as far as the task release uses it: one active service and its tasks, each protected or not."""

    def __init__(self, tasks: int) -> None:
        self.desired = tasks
        self.protected = {f"arn:aws:ecs:{REGION}:1:task/c/{n}": True for n in range(tasks)}

    def describe_services(self, cluster: str, services: list[str]) -> dict[str, Any]:
        return {"services": [{"status": "ACTIVE", "desiredCount": self.desired}]}

    def update_service(self, cluster: str, service: str, desiredCount: int) -> None:
        self.desired = desiredCount

    def get_paginator(self, name: str) -> Any:
        tasks = list(self.protected)

        class Pages:
            def paginate(self, cluster: str, serviceName: str) -> Iterator[dict[str, Any]]:
                yield {"taskArns": tasks}

        return Pages()

    def update_task_protection(self, cluster: str, tasks: list[str], protectionEnabled: bool) -> None:
        assert len(tasks) <= 10  # the API's limit
        for task in tasks:
            self.protected[task] = protectionEnabled


def test_a_delete_sets_the_service_to_zero_and_lifts_every_tasks_protection():
    # GIVEN a service with 12 tasks, each protected (busy with a long job)
    ecs = _EcsWithTasks(12)
    # WHEN the stack deletes the task protection release (just before the service)
    result = handle(
        _event(TASK_PROTECTION_RELEASE, "Delete", Cluster="c", Service="gpu-workers"), ecs=ecs, autoscaling=None
    )
    # THEN the service wants no task and none is protected (ECS stops them in their stop timeout)
    assert ecs.desired == 0 and not any(ecs.protected.values()) and len(result.released) == 12


def test_a_delete_step_that_fails_lets_the_delete_go_on():
    # GIVEN ECS refusing the call WHEN the task release is deleted THEN the step reports done (no DELETE_FAILED)
    class Refusing(_EcsWithTasks):
        def update_service(self, cluster: str, service: str, desiredCount: int) -> None:
            raise RuntimeError("AccessDenied")

    result = handle(
        _event(TASK_PROTECTION_RELEASE, "Delete", Cluster="c", Service="gpu-workers"), ecs=Refusing(1), autoscaling=None
    )
    assert result.released == []


def test_an_unknown_resource_type_is_refused_by_name():
    with pytest.raises(ValueError, match="Custom::Other"):
        handle(_event("Custom::Other", "Create"), ecs=None, autoscaling=None)
