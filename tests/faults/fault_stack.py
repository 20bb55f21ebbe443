"""A local stack of its own for the fault-injection tests: the same template-deployed stack as the end-to-end
suite's, with no workers, talked to through clients built with its explicit endpoint. Workers are started per test
from the task definition, with the faults they are meant to suffer (``WORKER_FAULTS``, see ``gpu_worker/faults.py``)
and short timings (``FAST_RECOVERY``), and nobody replaces them when they die: the tests decide.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from boto3.dynamodb.types import TypeDeserializer

from async_inference import settings
from async_inference.config import ServiceConfig
from async_inference.schemas import Job
from async_inference_client import Client
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment
from local_runtime.subscribers import subscribe_queue

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "faults-tenant-key-0123456789"
TENANT = "faults"
# Held messages stay invisible ~2 s and come back ~2 s after a SIGKILL; transient faults are retried at once.
FAST_RECOVERY = {
    "ENGINE": "echo",
    "RECEIVE_WAIT_S": "1",
    "HEARTBEAT_INTERVAL_S": "0.5",
    "VISIBILITY_TIMEOUT_S": "2",
    "DRAIN_TIMEOUT_S": "5",
    "TRANSIENT_RETRY_DELAY_S": "0",
    "LOG_LEVEL": "INFO",
}


class FaultStack:
    """The stack, clients on its moto server, and the worker processes the tests start."""

    def __init__(self, log_dir: Path, assembly: Path) -> None:
        self.log_dir = log_dir
        self.local = LocalDeployment(
            assembly=assembly,
            api_port=free_port(),
            moto_port=free_port(),
            api_keys={API_KEY: TENANT},
            workers=0,
            engine="echo",
            log_dir=log_dir,
        )
        self.api_url = self.local.api_url
        self.moto_url = self.local.moto.url
        self.workers: list[subprocess.Popen[bytes]] = []
        self.config: ServiceConfig

    # --- lifecycle --------------------------------------------------------------------------------------------------

    def start(self) -> FaultStack:
        self.local.start()
        assert self.local.resources is not None
        self.config = self.local.resources.config
        return self

    def stop(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.local.stop()

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to use this stack (the CLI)."""
        return self.local.env

    # --- workers ----------------------------------------------------------------------------------------------------

    def start_worker(self, name: str, **extra_env: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker-{name}.log", "ab")
        process = self.local.start_worker(log=log, **{**FAST_RECOVERY, **extra_env})
        process.log_path = self.log_dir / f"worker-{name}.log"  # type: ignore[attr-defined]
        self.workers.append(process)
        return process

    def stop_worker(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=30)

    # --- clients and reads ------------------------------------------------------------------------------------------

    def client(self, service: str) -> Any:
        return self.local.client(service)

    def api(self) -> Client:
        return Client(self.api_url, API_KEY)

    def job(self, job_id: str) -> Job:
        item = self.client("dynamodb").get_item(
            TableName=self.config.table_name, Key={"job_id": {"S": job_id}}, ConsistentRead=True
        )["Item"]
        return Job.model_validate({k: TypeDeserializer().deserialize(v) for k, v in item.items()})

    def result_objects(self, job_id: str, *, bucket: str | None = None) -> list[dict[str, Any]]:
        """Every write of the job's result object, oldest first: one per object version. The deployed bucket is
        versioned, so a second write is a second version, where listing the key would show one object either way."""
        s3, key, bucket = self.client("s3"), settings.result_key(TENANT, job_id), bucket or self.config.bucket_name
        versions = [
            v
            for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=key)
            for v in page.get("Versions", [])
            if v["Key"] == key
        ]
        versions.reverse()  # S3 lists a key's versions newest first
        return [
            json.loads(s3.get_object(Bucket=bucket, Key=key, VersionId=v["VersionId"])["Body"].read()) for v in versions
        ]

    def queue_depth(self, url: str | None = None) -> int:
        attributes = self.client("sqs").get_queue_attributes(
            QueueUrl=url or self.config.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

    def empty_queue(self, timeout_s: float = 5.0) -> None:
        """Delete whatever a test left on the job queue (PurgeQueue is allowed once a minute only)."""
        sqs, deadline = self.client("sqs"), time.monotonic() + timeout_s
        while self.queue_depth() and time.monotonic() < deadline:
            for message in sqs.receive_message(
                QueueUrl=self.config.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", []):
                sqs.delete_message(QueueUrl=self.config.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def wait_final(self, job_ids: list[str], timeout_s: float = 30.0) -> dict[str, Job]:
        """Every job once all are final; AssertionError naming the stragglers after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = {job_id: self.job(job_id) for job_id in job_ids}
            if all(j.status.is_final for j in jobs.values()):
                return jobs
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not final after {timeout_s} s: "
                    + ", ".join(f"{i}={j.status.value}" for i, j in jobs.items() if not j.status.is_final)
                )
            time.sleep(0.2)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class Subscriber:
    """A queue subscribed to the result topic: every notification, by job id."""

    def __init__(self, stack: FaultStack) -> None:
        self._sqs = stack.client("sqs")
        self.url = subscribe_queue(
            stack.config.topic_arn, f"faults-subscriber-{free_port()}", sqs=self._sqs, sns=stack.client("sns")
        )
        self.by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def drain(self, quiet_s: float = 0.5) -> dict[str, list[dict[str, Any]]]:
        """Read until the queue has been empty for ``quiet_s``; all notifications seen so far."""
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            messages = self._sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get("Messages", [])
            for message in messages:
                body = json.loads(message["Body"])
                self.by_job[body["job_id"]].append(body)
            if messages:
                self._sqs.delete_message_batch(
                    QueueUrl=self.url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
                quiet_since = time.monotonic()
            else:
                time.sleep(0.1)
        return self.by_job


def chat(prompt: str = "hello fault tests", **overrides: Any) -> dict[str, Any]:
    return {"model": "echo-model", "messages": [{"role": "user", "content": prompt}], **overrides}
