"""Wake from zero, end to end: the template-deployed API sets the worker service's desired count in moto to 1 when a
job arrives and the service has none, once per burst per execution environment.

A stack of its own, so that its API functions' execution environments have checked nothing yet when the test starts
(the session stack's have, during other tests, and each checks at most once a minute). moto holds the cluster, the
registered task definition and the service as the deployer created them from the template; setting the count to 0
stands in for the keep-alive alarm, which does not run here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from async_inference.schemas import ChatCompletionRequest
from async_inference_client import Client
from local_runtime.moto_server import free_port
from local_runtime.stack import API_FUNCTION_INSTANCES, LocalDeployment

pytestmark = pytest.mark.e2e
KEY = "wake-tenant-key-0123456789"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[LocalDeployment]:
    stack = LocalDeployment(
        assembly=local_assembly,
        api_port=free_port(),
        moto_port=free_port(),
        api_keys={KEY: "demo"},
        workers=0,
        engine="echo",
        log_dir=tmp_path_factory.mktemp("wake-logs"),
    )
    stack.start()
    yield stack
    stack.stop()


def _service(local: LocalDeployment) -> tuple[str, str]:
    assert local.deployment is not None
    [service] = local.deployment.of_type("AWS::ECS::Service").values()
    return service.properties["Cluster"], service.ref


def desired(local: LocalDeployment) -> int:
    cluster, arn = _service(local)
    return local.client("ecs").describe_services(cluster=cluster, services=[arn])["services"][0]["desiredCount"]


def set_desired(local: LocalDeployment, count: int) -> None:
    cluster, arn = _service(local)
    local.client("ecs").update_service(cluster=cluster, service=arn, desiredCount=count)


def submit_burst(local: LocalDeployment, jobs: int) -> None:
    api = Client(local.api_url, KEY)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "wake"}])
    for _ in range(jobs):
        api.submit(request)


def test_the_service_deploys_into_moto_at_zero_tasks(local: LocalDeployment):
    # GIVEN the template's service, whose DesiredCount is its Custom::WorkerDesiredCount's (issue 27: CloudFormation's
    # 1 for a service without one made the create wait for a GPU task) WHEN deployed THEN it starts at 0, on the
    # registered task definition
    assert desired(local) == 0
    cluster, arn = _service(local)
    [service] = local.client("ecs").describe_services(cluster=cluster, services=[arn])["services"]
    assert (
        service["taskDefinition"].startswith("arn:aws:ecs:us-east-1:")
        and ":task-definition/" in service["taskDefinition"]
    )


def test_with_no_gpu_a_job_is_accepted_reads_queued_and_wakes_the_service(local: LocalDeployment):
    # GIVEN the stack as created: the service at 0 tasks and no worker anywhere (a G quota of 0 runs none)
    assert desired(local) == 0 and not local.workers
    # WHEN a job is submitted
    api = Client(local.api_url, KEY)
    job = api.submit(ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "no gpu"}]))
    # THEN it is accepted and reads queued, and the API asked ECS for the first task
    assert job.status == "queued" and api.get(job.job_id).status == "queued"
    assert desired(local) == 1


def test_a_burst_on_a_service_at_zero_wakes_it_once_per_environment_and_interval(local: LocalDeployment):
    # GIVEN the service scaled to zero (as the keep-alive alarm would)
    set_desired(local, 0)
    # WHEN a burst of jobs arrives, enough for every API execution environment to take some
    submit_burst(local, 2 * API_FUNCTION_INSTANCES)
    # THEN the service wants one task, not one a job
    assert desired(local) == 1
    # WHEN it is at zero again within the minute and another burst arrives
    set_desired(local, 0)
    submit_burst(local, 2 * API_FUNCTION_INSTANCES)
    # THEN no environment asked ECS again: each checked once in the first burst (the alarms take over until the
    # interval has passed)
    assert desired(local) == 0
