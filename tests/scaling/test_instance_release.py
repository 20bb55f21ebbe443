"""The release of empty GPU instances (async_inference.instance_release) against a small fake of ECS and EC2 Auto
Scaling that keeps their documented rules: ECS places no task on a DRAINING instance, and the group's scale-in
terminates only instances without scale-in protection (ECS protects every instance it places a task on)."""

from __future__ import annotations

from dataclasses import dataclass, field

from async_inference.instance_release import capacity_groups, release_empty_instances


@dataclass
class Instance:
    arn: str
    ec2: str
    running: int = 0
    pending: int = 0
    status: str = "ACTIVE"
    protected: bool = True
    terminated: bool = False


@dataclass
class Fake:
    """ECS and Auto Scaling over one set of instances. ``task_on_drain``: an instance that gets a task placed just
    before the release drains it (the race the re-check closes)."""

    instances: list[Instance]
    task_on_drain: str | None = None
    desired: int = 0
    calls: list[str] = field(default_factory=list)
    services: list[dict[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.desired = len(self.instances)

    # ECS
    def get_paginator(self, name):
        fake = self

        class Pages:
            def paginate(self, cluster, status=None):
                if name == "list_services":
                    yield {"serviceArns": [f"svc/{n}" for n in range(len(fake.services))]}
                    return
                yield {
                    "containerInstanceArns": [i.arn for i in fake.instances if i.status == status and not i.terminated]
                }

        return Pages()

    def describe_services(self, cluster, services):
        return {"services": [self.services[int(arn.split("/")[1])] for arn in services]}

    def describe_container_instances(self, cluster, containerInstances):
        return {
            "containerInstances": [
                {
                    "containerInstanceArn": i.arn,
                    "ec2InstanceId": i.ec2,
                    "runningTasksCount": i.running,
                    "pendingTasksCount": i.pending,
                }
                for i in self.instances
                if i.arn in containerInstances
            ]
        }

    def update_container_instances_state(self, cluster, containerInstances, status):
        self.calls.append(f"{status} {sorted(containerInstances)}")
        for i in self.instances:
            if i.arn in containerInstances:
                if status == "DRAINING" and i.arn == self.task_on_drain:
                    i.pending += 1  # ECS placed it a moment before the drain took effect
                i.status = status

    # Auto Scaling
    def set_instance_protection(self, AutoScalingGroupName, InstanceIds, ProtectedFromScaleIn):
        for i in self.instances:
            if i.ec2 in InstanceIds:
                i.protected = ProtectedFromScaleIn

    def describe_auto_scaling_groups(self, AutoScalingGroupNames):
        return {"AutoScalingGroups": [{"DesiredCapacity": self.desired}]}

    def set_desired_capacity(self, AutoScalingGroupName, DesiredCapacity, HonorCooldown):
        surplus = self.desired - DesiredCapacity
        self.desired = DesiredCapacity
        for i in self.instances:  # the group's scale-in: unprotected instances only
            if surplus and not i.protected and not i.terminated:
                i.terminated, surplus = True, surplus - 1


def test_an_empty_instance_is_released_and_a_busy_one_never():
    # GIVEN one instance running a task and one empty
    busy, empty = Instance("ci/busy", "i-busy", running=1), Instance("ci/empty", "i-empty")
    fake = Fake([busy, empty])
    # WHEN the release runs
    done = release_empty_instances(fake, fake, cluster="c", group="g")
    # THEN the empty one is drained, unprotected and scaled in; the busy one keeps its protection and its place
    assert done.released == ("i-empty",) and done.kept == ()
    assert (empty.terminated, busy.terminated, busy.protected, fake.desired) == (True, False, True, 1)


def test_an_instance_that_got_a_task_before_its_drain_is_kept_and_made_active_again():
    # GIVEN an empty instance on which ECS places a task just as the release drains it
    late = Instance("ci/late", "i-late")
    fake = Fake([late], task_on_drain="ci/late")
    # WHEN the release runs THEN it sees the task on its second look, sets the instance ACTIVE and releases nothing
    done = release_empty_instances(fake, fake, cluster="c", group="g")
    assert done.released == () and done.kept == ("i-late",)
    assert (late.status, late.protected, late.terminated, fake.desired) == ("ACTIVE", True, False, 1)
    assert fake.calls == ["DRAINING ['ci/late']", "ACTIVE ['ci/late']"]


def test_an_empty_instance_is_kept_while_a_service_has_a_task_to_place():
    # GIVEN an empty instance (just started by the wake) and a service whose desired count is above its running count
    fresh = Instance("ci/fresh", "i-fresh")
    fake = Fake([fresh], services=[{"desiredCount": 1, "runningCount": 0}])
    # WHEN the release runs THEN it drains nothing and releases nothing: the task may be placed on that instance
    done = release_empty_instances(fake, fake, cluster="c", group="g")
    assert done.released == () and fake.calls == []
    assert (fresh.status, fresh.protected, fresh.terminated, fake.desired) == ("ACTIVE", True, False, 1)


def test_an_empty_instance_is_released_once_every_service_runs_what_it_wants():
    # GIVEN an empty instance and services that run all they want (one at zero)
    idle = Instance("ci/idle", "i-idle")
    fake = Fake([idle], services=[{"desiredCount": 0, "runningCount": 0}, {"desiredCount": 2, "runningCount": 2}])
    # WHEN the release runs THEN the empty instance goes
    assert release_empty_instances(fake, fake, cluster="c", group="g").released == ("i-idle",)


def test_nothing_to_release_makes_no_change():
    # GIVEN every instance busy WHEN the release runs THEN no instance is drained and the group is left alone
    fake = Fake([Instance("ci/a", "i-a", running=1), Instance("ci/b", "i-b", pending=1)])
    assert release_empty_instances(fake, fake, cluster="c", group="g").released == ()
    assert (fake.calls, fake.desired) == ([], 2)


def test_the_groups_are_read_from_the_clusters_capacity_providers():
    # GIVEN a cluster with the GPU capacity provider (and FARGATE, which has no group) WHEN asked for its groups
    class Ecs:
        def describe_clusters(self, clusters):
            return {"clusters": [{"clusterName": clusters[0], "capacityProviders": ["Gpu", "FARGATE"]}]}

        def describe_capacity_providers(self, capacityProviders):
            return {
                "capacityProviders": [
                    {
                        "name": "Gpu",
                        "autoScalingGroupProvider": {
                            "autoScalingGroupArn": "arn:aws:autoscaling:us-east-1:111122223333:autoScalingGroup:uuid:autoScalingGroupName/gpu-asg"
                        },
                    },
                    {"name": "FARGATE"},
                ]
            }

    # THEN the GPU group's name comes back, and nothing for FARGATE
    assert capacity_groups(Ecs(), "workers") == ["gpu-asg"]
