"""One local stack (moto server subprocess, the API gateway, the event pollers) for the end-to-end tests.

Workers are started per test, as subprocesses, with the echo engine: tests decide when a worker runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from async_inference_client import Client
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment
from local_runtime.subscribers import subscribe_queue

TENANT_KEYS = {"tenant-a-key-0123456789": "tenant-a", "tenant-b-key-0123456789": "tenant-b"}
# The model names the echo engine answers to in these tests, and the embedding model a test starts a CPU embedding
# worker for (MODEL_KIND=embedding); any other is a 404 model_not_found.
EMBEDDING_MODEL = "all-MiniLM-L6-v2"
SERVED_MODELS = ("echo-model", "model-x", "model-y", EMBEDDING_MODEL)
FAST_WORKER = {"RECEIVE_WAIT_S": "1", "HEARTBEAT_INTERVAL_S": "1", "DRAIN_TIMEOUT_S": "5"}


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[LocalDeployment]:
    logs = tmp_path_factory.mktemp("logs")
    log = open(logs / "workers.log", "ab")
    local = LocalDeployment(
        assembly=local_assembly,
        api_port=free_port(),
        moto_port=free_port(),
        api_keys=TENANT_KEYS,
        workers=0,
        engine="echo",
        worker_env=FAST_WORKER,
        worker_log=log,
        log_dir=logs,
        served_models=SERVED_MODELS,
    )
    local.start()
    # This test process is a client of the stack: boto3 clients made without an endpoint (async_inference.aws.client)
    # talk to its moto server.
    saved = dict(os.environ)
    os.environ.update(local.env)
    yield local
    os.environ.clear()
    os.environ.update(saved)
    local.stop()
    log.close()


@pytest.fixture(scope="session")
def api(stack: LocalDeployment) -> Client:
    return Client(stack.api_url, "tenant-a-key-0123456789")


@pytest.fixture(scope="session")
def other_api(stack: LocalDeployment) -> Client:
    return Client(stack.api_url, "tenant-b-key-0123456789")


@pytest.fixture
def worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker()
    yield process
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


class Subscriber:
    """An SQS queue subscribed to the result topic, as a subscriber would: notifications by job id."""

    def __init__(self, stack: LocalDeployment, filter_policy: dict[str, Any] | None = None) -> None:
        from async_inference.aws import client

        assert stack.resources is not None
        self._sqs = client("sqs")
        self.url = subscribe_queue(
            stack.resources.config.topic_arn, f"subscriber-{free_port()}", filter_policy=filter_policy
        )
        self.by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.attributes: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def drain(self, wait_s: float = 1.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            messages = self._sqs.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageAttributeNames=["All"]
            ).get("Messages", [])
            for message in messages:
                body = json.loads(message["Body"])
                subject = body.get("job_id") or body["data"]["id"]  # a job's notification, or a batch's event
                self.by_job[subject].append(body)
                self.attributes[subject].append(
                    {k: v["StringValue"] for k, v in message.get("MessageAttributes", {}).items()}
                )
                self._sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])
            if not messages and time.monotonic() > deadline:
                return
            if not messages:
                time.sleep(0.1)

    def for_job(self, job_id: str, wait_s: float = 1.0) -> list[dict[str, Any]]:
        self.drain(wait_s)
        return self.by_job.get(job_id, [])


@pytest.fixture(scope="session")
def subscriber(stack: LocalDeployment) -> Subscriber:
    return Subscriber(stack)


def chat(prompt: str = "hello from the tests", **overrides: Any) -> dict[str, Any]:
    return {"model": "echo-model", "messages": [{"role": "user", "content": prompt}], **overrides}


def worker_log(stack: LocalDeployment) -> str:
    log = stack.worker_log
    return Path(log.name).read_text(errors="replace")[-4000:] if hasattr(log, "name") else ""
