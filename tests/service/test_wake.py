"""Wake from zero (async_inference.wake) against moto's ECS over HTTP: one check per interval, a failure costs nothing.

moto holds the cluster, a registered task definition and the service, and answers DescribeServices and UpdateService
as ECS does (it places no tasks). The clock is the waker's own, so the interval is stepped rather than waited out.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from async_inference import settings
from async_inference.aws import WAKE_HOLD_RELEASE, CapacityGroup, WorkerService, client
from async_inference.config import ServiceConfig, ServiceSettings, WakeSettings, WakeTarget
from async_inference.fleets import FleetRoute
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest, JobSubmission
from async_inference.wake import ServiceWaker
from local_runtime.moto_server import MotoServer


@pytest.fixture
def service_arn(moto: MotoServer, request: pytest.FixtureRequest) -> str:
    """A worker service at zero tasks, in a cluster of its own."""
    ecs = client("ecs")
    cluster = f"workers-{request.node.name[-40:].replace('[', '-').replace(']', '')}"
    ecs.create_cluster(clusterName=cluster)
    definition = ecs.register_task_definition(
        family="worker", containerDefinitions=[{"name": "worker", "image": "worker:latest", "memoryReservation": 512}]
    )["taskDefinition"]["taskDefinitionArn"]
    return ecs.create_service(cluster=cluster, serviceName="workers", taskDefinition=definition, desiredCount=0)[
        "service"
    ]["serviceArn"]


def cluster_of(arn: str) -> str:
    return arn.split("/")[-2]  # arn:aws:ecs:<region>:<account>:service/<cluster>/<service>


def desired(arn: str) -> int:
    return client("ecs").describe_services(cluster=cluster_of(arn), services=[arn])["services"][0]["desiredCount"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_queued_job_sets_a_service_at_zero_to_one_task(service_arn: str):
    # GIVEN a worker service at zero tasks
    waker = ServiceWaker(WorkerService(cluster_of(service_arn), service_arn), check_interval_s=60, clock=Clock())
    # WHEN a job is queued THEN its desired count is 1
    assert waker.job_queued() is True
    assert desired(service_arn) == 1


def test_a_burst_checks_once_per_interval_and_never_adds_to_a_running_count(service_arn: str):
    # GIVEN a waker that just woke the service, which ECS then scaled to 2 tasks
    clock = Clock()
    ecs = client("ecs")
    waker = ServiceWaker(WorkerService(cluster_of(service_arn), service_arn, ecs=ecs), check_interval_s=60, clock=clock)
    waker.job_queued()
    ecs.update_service(cluster=cluster_of(service_arn), service=service_arn, desiredCount=0)
    # WHEN 50 more jobs are queued within the interval THEN nothing is asked of ECS (the count set to 0 stays 0)
    for _ in range(50):
        clock.now += 1
        assert waker.job_queued() is False
    assert (waker.checks, desired(service_arn)) == (1, 0)
    # WHEN the interval has passed THEN the next job checks again and wakes it
    clock.now += 11
    assert waker.job_queued() is True
    assert (waker.checks, waker.wakes, desired(service_arn)) == (2, 2, 1)
    # AND a service already running 2 tasks is left at 2
    ecs.update_service(cluster=cluster_of(service_arn), service=service_arn, desiredCount=2)
    clock.now += 60
    assert waker.job_queued() is False
    assert desired(service_arn) == 2


def test_a_failed_wake_is_counted_and_logged_and_does_not_raise(moto: MotoServer, capsys, caplog):
    # GIVEN a waker pointed at a service ECS does not know
    waker = ServiceWaker(WorkerService("no-such-cluster", "no-such-service"), check_interval_s=60, clock=Clock())
    # WHEN a job is queued THEN the call returns, the failure is counted, logged and emitted as one EMF record
    assert waker.job_queued() is False
    assert waker.failures == 1
    assert "could not wake the worker service no-such-service" in caplog.text
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r[settings.METRIC_WAKE_FAILURES] for r in records] == [[1.0]]
    assert records[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == settings.METRICS_NAMESPACE


def test_a_submit_wakes_only_after_its_job_is_queued(moto: MotoServer, service_arn: str):
    # GIVEN the service settings a deployed API function reads (the stack's wake variables, the model's route naming
    # its service), the route's job queue not there (deleted)
    sqs = client("sqs")
    queue_url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
    sqs.delete_queue(QueueUrl=queue_url)
    route = FleetRoute(queue_url=queue_url, worker_service=service_arn)
    env = {
        **ServiceConfig(
            table_name="jobs",
            bucket_name="claims",
            topic_arn=client("sns").create_topic(Name="results")["TopicArn"],
            queue_url=None,
            wake=WakeSettings(cluster_of(service_arn), 60),
            fleets={"m": route},
        ).to_env()
    }
    config = ServiceSettings.load(**{k: v for k, v in _by_field(env).items()})
    client("s3").create_bucket(Bucket="claims")
    client("dynamodb").create_table(
        TableName="jobs",
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
    )
    service = JobService.from_config(config.service)
    submission = JobSubmission(request=ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]))
    # WHEN the queue refuses the job THEN the client gets its 503 and the service is not woken for nothing
    with pytest.raises(Exception, match="job queue is unavailable"):
        service.api.submit("tenant-a", submission, None)
    assert desired(service_arn) == 0
    # WHEN the queue is back and a job is queued THEN the service wants one task
    assert sqs.create_queue(QueueName="jobs")["QueueUrl"] == queue_url
    service.api.submit("tenant-a", submission, None)
    assert desired(service_arn) == 1


def _by_field(env: dict[str, str]) -> dict[str, str]:
    """ServiceSettings' field names for the environment ServiceConfig writes."""
    aliases = {f.alias: name for name, f in ServiceSettings.model_fields.items()}
    return {aliases[k]: v for k, v in env.items() if k in aliases}


def _scaling_target(service_arn: str) -> dict:
    return {
        "ServiceNamespace": "ecs",
        "ScalableDimension": "ecs:service:DesiredCount",
        "ResourceId": f"service/{cluster_of(service_arn)}/{service_arn.split('/')[-1]}",
    }


def test_a_wake_holds_the_scaling_minimum_and_schedules_its_end(service_arn: str):
    # GIVEN a service at zero whose scalable target has a minimum of 0 (as the stack registers it)
    scaling = client("application-autoscaling")
    target = _scaling_target(service_arn)
    scaling.register_scalable_target(**target, MinCapacity=0, MaxCapacity=2)
    now = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
    waker = ServiceWaker(
        WorkerService(cluster_of(service_arn), service_arn),
        check_interval_s=60,
        hold_s=300,
        clock=Clock(),
        utcnow=lambda: now,
    )
    # WHEN a job wakes it
    assert waker.job_queued() is True
    # THEN the minimum is 1 (an alarm re-running ScaleToZero cannot undo the wake) and a scheduled action puts it
    # back to 0 five minutes later
    [registered] = scaling.describe_scalable_targets(ServiceNamespace="ecs")["ScalableTargets"]
    assert (registered["MinCapacity"], registered["MaxCapacity"], desired(service_arn)) == (1, 2, 1)
    [action] = scaling.describe_scheduled_actions(ServiceNamespace="ecs")["ScheduledActions"]
    assert (action["ScheduledActionName"], action["Schedule"], action["ScalableTargetAction"]["MinCapacity"]) == (
        WAKE_HOLD_RELEASE,
        "at(2026-12-01T12:05:00)",
        0,
    )


def test_a_wake_that_knows_the_maximum_holds_the_service_at_one_task_and_schedules_both_back(service_arn: str):
    # GIVEN a service at zero whose scalable target allows 0 to 2 tasks, and a waker that knows the maximum
    scaling = client("application-autoscaling")
    target = _scaling_target(service_arn)
    scaling.register_scalable_target(**target, MinCapacity=0, MaxCapacity=2)
    now = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
    waker = ServiceWaker.for_target(
        WakeTarget(cluster_of(service_arn), service_arn, 60, hold_s=300, max_tasks=2, hold_max_tasks=1)
    )
    waker._utcnow, waker._clock = (lambda: now), Clock()
    # WHEN a job wakes it
    assert waker.job_queued() is True
    # THEN minimum and maximum are 1 (no scale-out adds a task while the first starts), and the scheduled action puts
    # them back to 0 and 2 five minutes later
    mine = {"ServiceNamespace": "ecs", "ResourceIds": [target["ResourceId"]]}
    [registered] = scaling.describe_scalable_targets(**mine)["ScalableTargets"]
    assert (registered["MinCapacity"], registered["MaxCapacity"], desired(service_arn)) == (1, 1, 1)
    [action] = scaling.describe_scheduled_actions(ServiceNamespace="ecs", ResourceId=target["ResourceId"])[
        "ScheduledActions"
    ]
    assert (action["Schedule"], action["ScalableTargetAction"]) == (
        "at(2026-12-01T12:05:00)",
        {"MinCapacity": 0, "MaxCapacity": 2},
    )


def test_a_hold_that_fails_leaves_the_wake_standing(service_arn: str, caplog):
    # GIVEN a waker whose hold will be refused (no scalable target registered for the service in moto)
    class Refusing:
        def put_scheduled_action(self, **kwargs):
            raise ConnectionError("Application Auto Scaling is down")

    service = WorkerService(cluster_of(service_arn), service_arn)
    service._scaling = Refusing()
    waker = ServiceWaker(service, check_interval_s=60, hold_s=300, clock=Clock())
    # WHEN a job is queued THEN the service is woken, the hold's failure counted and logged
    assert waker.job_queued() is True
    assert (desired(service_arn), waker.failures) == (1, 1)
    assert "could not hold its scaling bounds" in caplog.text


@pytest.fixture
def gpu_group(moto: MotoServer, request: pytest.FixtureRequest) -> str:
    """A GPU Auto Scaling group at 0 instances (as the stack leaves it idle), in moto."""
    ec2 = client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    name = f"gpu-{request.node.name[-40:]}"
    template = ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData={"ImageId": image, "InstanceType": "g5.xlarge"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateId": template},
        MinSize=0,
        MaxSize=2,
        DesiredCapacity=0,
        AvailabilityZones=["us-east-1a"],
    )
    return name


def group_desired(name: str) -> int:
    [group] = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return group["DesiredCapacity"]


def test_a_wake_starts_one_gpu_instance_without_waiting_for_managed_scaling(service_arn: str, gpu_group: str):
    # GIVEN a service at zero tasks and its GPU group at zero instances
    waker = ServiceWaker(
        WorkerService(cluster_of(service_arn), service_arn),
        check_interval_s=60,
        group=CapacityGroup(gpu_group),
        clock=Clock(),
    )
    # WHEN a job is queued THEN the service wants one task and the group one instance, at once
    assert waker.job_queued() is True
    assert (desired(service_arn), group_desired(gpu_group), waker.instance_starts) == (1, 1, 1)


def test_a_wake_never_lowers_a_group_that_has_capacity(service_arn: str, gpu_group: str):
    # GIVEN a service at zero tasks whose group still holds 2 instances (not yet released)
    client("autoscaling").set_desired_capacity(AutoScalingGroupName=gpu_group, DesiredCapacity=2)
    waker = ServiceWaker(
        WorkerService(cluster_of(service_arn), service_arn), check_interval_s=60, group=CapacityGroup(gpu_group)
    )
    # WHEN a job wakes the service THEN the group is left at 2 (the task lands on what is there)
    assert waker.job_queued() is True
    assert (desired(service_arn), group_desired(gpu_group), waker.instance_starts) == (1, 2, 0)


def test_a_wake_that_finds_the_service_running_does_not_touch_the_group(service_arn: str, gpu_group: str):
    # GIVEN a service already at one task (the alarms woke it) and its group at 0 (managed scaling on its way)
    client("ecs").update_service(cluster=cluster_of(service_arn), service=service_arn, desiredCount=1)
    waker = ServiceWaker(
        WorkerService(cluster_of(service_arn), service_arn), check_interval_s=60, group=CapacityGroup(gpu_group)
    )
    # WHEN a job is queued THEN nothing is started: only a wake from zero starts an instance
    assert waker.job_queued() is False
    assert group_desired(gpu_group) == 0


def test_an_instance_start_that_fails_leaves_the_wake_standing(service_arn: str, caplog, capsys):
    # GIVEN a waker whose group Auto Scaling does not know
    waker = ServiceWaker(
        WorkerService(cluster_of(service_arn), service_arn),
        check_interval_s=60,
        group=CapacityGroup("no-such-group"),
        clock=Clock(),
    )
    # WHEN a job is queued THEN the service is woken, the failed start counted, logged and emitted
    assert waker.job_queued() is True
    assert (desired(service_arn), waker.failures, waker.instance_starts) == (1, 1, 0)
    assert "could not start a GPU instance in no-such-group" in caplog.text
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [r[settings.METRIC_WAKE_FAILURES] for r in records] == [[1.0]]


def test_the_settings_and_a_fleets_route_carry_the_group_and_the_maxima_to_the_waker():
    # GIVEN the environment a deployed function gets: the stack's wake settings, and a fleet's route with its service,
    # group and maxima
    wake = WakeSettings("workers", 60, 300)
    route = FleetRoute(queue_url="q2", worker_service="arn:aws:ecs:us-east-1:123456789012:service/workers/gpu2",
                       worker_group="gpu-group", worker_max_tasks=4, worker_hold_max_tasks=2)  # fmt: skip
    env = ServiceConfig(table_name="jobs", bucket_name="claims", queue_url=None, topic_arn="t", wake=wake).to_env()
    # WHEN loaded and the fleet's waker is built
    loaded = ServiceSettings.load(**_by_field(env))
    service = JobService.from_config(dataclasses.replace(loaded.service, fleets={"second": route}))
    _, _, waker = service.queues.route("second")
    # THEN it wakes the route's service in the stack's cluster, at the stack's interval and hold, starts instances in
    # the route's group, holds the route's maximum and restores its own
    assert loaded.wake == wake and waker is not None
    assert (waker.service.cluster, waker.service.service) == ("workers", route.worker_service)
    assert (waker.check_interval_s, waker.hold_s) == (60, 300)
    assert waker.group is not None and waker.group.name == "gpu-group"
    assert (waker.hold_max_tasks, waker.max_tasks) == (2, 4)
