"""A task with a newer deployment waiting stops renewing its task protection and takes no more long jobs, so the
deployment finishes (issue #21, defect 4). ECS's agent (task protection, task metadata) is a small HTTP server here;
the service and its deployments are moto's ECS, as the worker reads them with DescribeServices."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from async_inference.aws import client
from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService
from gpu_worker.deployments import DeploymentWatch
from gpu_worker.task_protection import TaskProtection
from gpu_worker.worker import Worker, WorkerConfig
from local_runtime.worker_thread import WorkerThread
from tests.e2e.conftest import chat
from tests.e2e.test_worker_batching import Concurrency, RecordingQueue

pytestmark = pytest.mark.e2e

CLUSTER, SERVICE, FAMILY = "deploy-test", "gpu-workers", "gpu-worker-deploy-test"


class Agent:
    """ECS's agent as a task sees it: the task protection state (PUTs recorded) and the task metadata endpoint."""

    def __init__(self, revision: int) -> None:
        self.protection: list[bool] = []
        task = {"Cluster": CLUSTER, "ServiceName": SERVICE, "Family": FAMILY, "Revision": str(revision)}
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                agent.protection.append(body["ProtectionEnabled"])
                self._reply({"protection": body})

            def do_GET(self) -> None:  # noqa: N802
                self._reply(task)

            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def agent(stack) -> Iterator[Agent]:  # noqa: ANN001
    ecs = client("ecs")
    ecs.create_cluster(clusterName=CLUSTER)
    revision = ecs.register_task_definition(
        family=FAMILY, containerDefinitions=[{"name": "worker", "image": "worker", "memory": 256}]
    )["taskDefinition"]["revision"]
    ecs.create_service(cluster=CLUSTER, serviceName=SERVICE, taskDefinition=f"{FAMILY}:{revision}", desiredCount=1)
    running = Agent(revision)
    yield running
    running.server.shutdown()
    ecs.delete_service(cluster=CLUSTER, service=SERVICE, force=True)


def test_a_newer_deployment_clears_protection_and_leaves_long_jobs_to_it(stack, api, agent: Agent):
    # GIVEN a worker that protects its task while it runs a job that could outlast its 2 s drain, running one
    queue = RecordingQueue(stack.resources.config.queue_url)
    config = ServiceSettings.load().service
    base = JobService.from_config(config)
    service = JobService(store=base.store, blobs=base.blobs, queue=queue, notifier=base.notifier)
    engine = Concurrency(capacity=2, delay_s=6.0)
    worker = Worker(
        WorkerConfig(
            service=config,
            receive_wait_s=1,
            heartbeat_interval_s=0.3,
            visibility_timeout_s=5,
            drain_timeout_s=2,
            task_protection="long_jobs",
            task_protection_renew_s=0.5,
        ),
        engine,
        service=service,
        protection=TaskProtection(agent.url),
        deployments=DeploymentWatch(agent.url, interval_s=0.3),
    )
    with WorkerThread(worker) as running:
        first = api.submit(chat("a long one", max_tokens=200))  # 200 tokens at 20/s: 10 s, beyond the drain
        deadline = time.monotonic() + 30
        while not (first.job_id in engine.seen and agent.protection) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.protection == [True]
        # WHEN a newer deployment of its service is made (a new task definition revision)
        ecs = client("ecs")
        newer = ecs.register_task_definition(
            family=FAMILY, containerDefinitions=[{"name": "worker", "image": "worker:2", "memory": 256}]
        )["taskDefinition"]["revision"]
        ecs.update_service(cluster=CLUSTER, service=SERVICE, taskDefinition=f"{FAMILY}:{newer}")
        while agent.protection[-1] and time.monotonic() < deadline:
            time.sleep(0.05)
        # THEN it clears its protection while the long job still runs, and renews it no more
        assert agent.protection[-1] is False
        assert api.get(first.job_id).status == "running"
        # AND a long job that arrives now is left on the queue for the new deployment's tasks, never started here
        second = api.submit(chat("another long one", max_tokens=200))
        while not any(second.job_id in body for body in queue.bodies) and time.monotonic() < deadline:
            time.sleep(0.05)
        while running.jobs_finished < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert any(second.job_id in body for body in queue.bodies), "the worker never received the second job"
    assert engine.seen == [first.job_id]
    assert (api.get(second.job_id).status, api.get(second.job_id).attempts) == ("queued", 0)
    assert api.get(first.job_id).status == "succeeded"
    # (renewed once or more before the newer deployment was seen, as a loaded host may; never after)
    cleared = agent.protection.index(False)
    assert all(agent.protection[:cleared]) and agent.protection[cleared:] == [False], agent.protection
    api.cancel(second.job_id)
    # AND it went back as a new message, so that leaving it spent none of the receives that lead to the dead-letter
    # queue (each old task's refusal once counted one: a deployment could dead-letter a long job)
    assert _receive_count_of(queue.url, second.job_id, timeout_s=15) == 1


def _receive_count_of(queue_url: str, job_id: str, timeout_s: float) -> int | None:
    """The receive count SQS reports for the job's claim check when this test receives it (which deletes it), putting
    back any other message at once."""
    sqs, deadline = client("sqs"), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["ApproximateReceiveCount"]
        ).get("Messages", []):
            if job_id in message["Body"]:
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
                return int(message["Attributes"]["ApproximateReceiveCount"])
            sqs.change_message_visibility(
                QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
    return None
