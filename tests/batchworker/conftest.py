"""Fixtures of the batch-lane worker tests: the template-deployed stack of the fault tests, plus the batch resources
and the batch table's adapter from ``bench.batch_standin`` (STAND-INs until the API side of batches is merged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import botocore.client
import pytest

from async_inference import settings
from async_inference.schemas import BatchControl
from bench.batch_standin import StandInBatchStore, SubmittedBatch, create_batch_resources, input_line, submit_batch
from gpu_worker.engines.base import Engine
from gpu_worker.worker import Worker, WorkerConfig
from local_runtime.worker_thread import WorkerThread
from tests.faults.fault_stack import FAST_RECOVERY, TENANT, FaultStack

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "echo-model"


def body(prompt: str = "hello batch", **overrides: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **overrides}


def lines(count: int, prefix: str = "req", **overrides: Any) -> list[bytes]:
    return [input_line(f"{prefix}-{i}", body(f"line {i} of {prefix}", **overrides)) for i in range(count)]


class AwsRequests:
    """Every AWS request the in-process worker's I/O threads make while it is installed: (operation, params)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], Any]] = []
        self._lock = threading.Lock()

    @contextmanager
    def installed(self) -> Iterator[AwsRequests]:
        original = botocore.client.BaseClient._make_api_call
        recorder = self

        def recording(client: Any, operation: str, params: dict[str, Any]) -> Any:
            result = original(client, operation, params)
            if threading.current_thread().name.startswith("io"):
                with recorder._lock:
                    recorder.calls.append((operation, params, result))
            return result

        botocore.client.BaseClient._make_api_call = recording  # type: ignore[method-assign]
        try:
            yield self
        finally:
            botocore.client.BaseClient._make_api_call = original  # type: ignore[method-assign]


class BatchStack:
    """The fault tests' stack with the batch lane's queues and table, and what the tests read of a batch."""

    def __init__(self, fstack: FaultStack) -> None:
        self.fstack = fstack
        self.config = fstack.config
        self.s3, self.sqs = fstack.client("s3"), fstack.client("sqs")
        self.resources = create_batch_resources(self.sqs, fstack.client("dynamodb"))
        self.store = StandInBatchStore(self.resources.table_name, dynamodb=fstack.client("dynamodb"))

    # --- driving ----------------------------------------------------------------------------------------------------

    def submit(self, input_lines: list[bytes], **options: Any) -> SubmittedBatch:
        return submit_batch(s3=self.s3, sqs=self.sqs, store=self.store, bucket=self.config.bucket_name,
                            batch_queue_url=self.resources.batch_queue_url, tenant=TENANT, lines=input_lines,
                            **options)

    def worker_config(self, **overrides: Any) -> WorkerConfig:
        options: dict[str, Any] = dict(
            service=self.config, receive_wait_s=1, heartbeat_interval_s=0.2, visibility_timeout_s=5,
            drain_timeout_s=2, transient_retry_delay_s=0, batch_queue_url=self.resources.batch_queue_url,
            control_queue_url=self.resources.control_queue_url,
        )
        options.update(overrides)
        return WorkerConfig(**options)

    def worker(self, engine: Engine, **overrides: Any) -> WorkerThread:
        """A worker in this process, with both lanes (``with stack.worker(engine) as w:``)."""
        return WorkerThread(Worker(self.worker_config(**overrides), engine,
                                   batches=StandInBatchStore(self.resources.table_name)))

    def start_process_worker(self, name: str, **extra_env: str) -> subprocess.Popen[bytes]:
        """A worker process with the task definition's environment and the batch lane (see ``standin_worker``)."""
        fleet = self.fstack.local.fleet
        assert fleet is not None
        env = fleet.environment({**FAST_RECOVERY, **self.resources.worker_env(), "PYTHONPATH": str(REPO_ROOT),
                                 **extra_env})
        log_path = self.fstack.log_dir / f"batch-worker-{name}.log"
        process = subprocess.Popen([sys.executable, "-m", "tests.batchworker.standin_worker"], env=env,
                                   cwd=REPO_ROOT, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)
        process.log_path = log_path  # type: ignore[attr-defined]
        self.fstack.workers.append(process)
        return process

    # --- reading ----------------------------------------------------------------------------------------------------

    def part(self, batch: SubmittedBatch, chunk: int, kind: str) -> list[dict[str, Any]] | None:
        """A chunk's output or error part as JSON lines; None when it is not written."""
        key = settings.batch_part_key(batch.tenant, batch.batch_id, chunk, kind)
        try:
            data = self.s3.get_object(Bucket=self.config.bucket_name, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def results(self, batch: SubmittedBatch) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every output line and every error line of the batch's parts, in chunk order."""
        outputs: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for chunk in range(batch.chunks):
            outputs.extend(self.part(batch, chunk, "output") or [])
            errors.extend(self.part(batch, chunk, "error") or [])
        return outputs, errors

    def versions(self, key: str) -> int:
        """Writes of an object: the deployed bucket is versioned, so each write is a version."""
        listing = self.s3.list_object_versions(Bucket=self.config.bucket_name, Prefix=key)
        return sum(1 for v in listing.get("Versions", []) if v["Key"] == key)

    def batch_keys(self, batch: SubmittedBatch) -> list[str]:
        """Every object the worker wrote for the batch (parts and results objects)."""
        prefix = f"{settings.BATCH_PREFIX}{batch.tenant}/{batch.batch_id}/"
        listing = self.s3.list_object_versions(Bucket=self.config.bucket_name, Prefix=prefix)
        return sorted({v["Key"] for v in listing.get("Versions", [])})

    def finalizes(self, wait_s: float = 1.0) -> list[BatchControl]:
        """Control messages sent since the last call (received and deleted)."""
        found: list[BatchControl] = []
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            messages = self.sqs.receive_message(QueueUrl=self.resources.control_queue_url, MaxNumberOfMessages=10,
                                                WaitTimeSeconds=0).get("Messages", [])
            for message in messages:
                found.append(BatchControl.model_validate_json(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.resources.control_queue_url,
                                        ReceiptHandle=message["ReceiptHandle"])
            if not messages:
                time.sleep(0.1)
        return found

    def wait_counted(self, batch: SubmittedBatch, timeout_s: float = 60.0) -> dict[str, Any]:
        """The batch item once every chunk is counted; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            item = self.store.get(batch.batch_id)
            if len(item["counted_chunks"]) == batch.chunks:
                return item
            if time.monotonic() > deadline:
                raise AssertionError(f"batch {batch.batch_id}: {len(item['counted_chunks'])} of {batch.chunks} chunks "
                                     f"counted after {timeout_s} s")
            time.sleep(0.1)

    def batch_queue_depth(self) -> int:
        return self.fstack.queue_depth(self.resources.batch_queue_url)

    def empty(self) -> None:
        """Delete what a test left on the batch and control queues."""
        for url in (self.resources.batch_queue_url, self.resources.control_queue_url):
            deadline = time.monotonic() + 5
            while self.fstack.queue_depth(url) and time.monotonic() < deadline:
                for message in self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                        WaitTimeSeconds=1).get("Messages", []):
                    self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture(scope="session")
def bstack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[BatchStack]:
    fstack = FaultStack(tmp_path_factory.mktemp("batch-logs"), local_assembly).start()
    # In-process workers build their clients without an endpoint (async_inference.aws.client): point them at moto.
    saved = dict(os.environ)
    os.environ.update(fstack.env)
    try:
        yield BatchStack(fstack)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        fstack.stop()


@pytest.fixture
def batches(bstack: BatchStack) -> Iterator[BatchStack]:
    """The stack, with every worker process a test started killed at its end and the queues left empty."""
    started = len(bstack.fstack.workers)
    yield bstack
    for process in bstack.fstack.workers[started:]:
        if process.poll() is None:
            process.kill()
            process.wait()
    bstack.empty()
    bstack.fstack.empty_queue()
