"""Fixtures of the batch-lane worker tests: the template-deployed stack of the fault tests, with its batch table, its
batch-lane and control queues and its batch controller function, and batches created as the API creates them.

A batch is created through ``BatchService`` (what ``POST /v1/files`` and ``POST /v1/batches`` run) over the deployed
resources; the template's controller function plans it from the control queue and finalizes it when the workers'
last chunk is counted, so a test follows a batch to its final state and its output and error files.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import botocore.client
import pytest

from async_inference import settings
from async_inference.batches.aws import ControlQueue, FileObjects
from async_inference.batches.models import BatchCreate, BatchRecord, BatchStatus
from async_inference.batches.service import BatchService
from async_inference.batches.store import BatchStore
from async_inference.served_models import ServedModels
from gpu_worker.engines.base import Engine
from gpu_worker.worker import Worker, WorkerConfig
from local_runtime.worker_thread import WorkerThread
from tests.faults.fault_stack import TENANT, FaultStack

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "echo-model"


def input_line(custom_id: str, body: dict[str, Any]) -> bytes:
    """One line of a batch input file, in OpenAI's format."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": settings.BATCH_ENDPOINT, "body": body}).encode()


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


@dataclass(frozen=True)
class Submitted:
    """A batch as planned by the controller: its id, tenant, chunk count, line count and input file's key."""

    batch_id: str
    tenant: str
    chunks: int
    lines: int
    input_key: str


class BatchStack:
    """The fault tests' stack, its batch resources (from the deployed stack's outputs), the API's BatchService over
    them, and what the tests read of a batch."""

    def __init__(self, fstack: FaultStack) -> None:
        self.fstack = fstack
        self.config = fstack.config
        self.s3, self.sqs = fstack.client("s3"), fstack.client("sqs")
        resources = fstack.local.resources
        assert resources is not None
        self.table_name = resources.batch_table_name
        self.batch_queue_url = resources.batch_queue_url
        self.control_queue_url = resources.batch_control_queue_url
        # The clients below are built without an endpoint: the bstack fixture points the process at moto.
        self.store = BatchStore(self.table_name)
        self.service = BatchService(
            store=self.store,
            files=FileObjects(self.config.bucket_name),
            control=ControlQueue(self.control_queue_url),
            served=ServedModels.of(fstack.local.served_models),
        )

    # --- driving ----------------------------------------------------------------------------------------------------

    def create(self, input_lines: list[bytes], *, completion_window_s: int | None = None) -> BatchRecord:
        """Upload the lines as a batch input file and create a batch over it, as the API does (its plan message is
        on the control queue). ``completion_window_s``: the deadline the API gives it, in place of OpenAI's 24 h."""
        data = b"\n".join(input_lines) + b"\n"
        file = self.service.create_file(TENANT, filename="input.jsonl", purpose="batch", data=data)
        window = (
            mock.patch.dict(settings.BATCH_COMPLETION_WINDOWS, {"24h": completion_window_s})
            if completion_window_s is not None
            else nullcontext()
        )
        with window:
            batch = self.service.create_batch(
                TENANT, BatchCreate(input_file_id=file.id, endpoint=settings.BATCH_ENDPOINT, completion_window="24h")
            )
        record = self.store.get_batch(batch.id)
        assert record is not None
        return record

    def submit(self, input_lines: list[bytes], **options: Any) -> Submitted:
        """A batch created as the API creates it and planned by the template's controller (its chunks on the batch
        lane, the batch in_progress)."""
        record = self.create(input_lines, **options)
        planned = self.wait_status(record.id, BatchStatus.IN_PROGRESS, timeout_s=30)
        return self.submitted(planned)

    @staticmethod
    def submitted(record: BatchRecord) -> Submitted:
        assert record.chunk_count is not None, f"batch {record.id} is not planned"
        return Submitted(record.id, record.tenant, record.chunk_count, record.total, record.input_key)

    def worker_config(self, **overrides: Any) -> WorkerConfig:
        options: dict[str, Any] = dict(
            service=self.config,
            receive_wait_s=1,
            heartbeat_interval_s=0.2,
            visibility_timeout_s=5,
            drain_timeout_s=2,
            transient_retry_delay_s=0,
            batch_queue_url=self.batch_queue_url,
            control_queue_url=self.control_queue_url,
        )
        options.update(overrides)
        return WorkerConfig(**options)

    def worker(self, engine: Engine, **overrides: Any) -> WorkerThread:
        """A worker in this process, with both lanes (``with stack.worker(engine) as w:``)."""
        return WorkerThread(Worker(self.worker_config(**overrides), engine, batches=BatchStore(self.table_name)))

    def queued_claims(self, batch: Submitted) -> list[str]:
        """The bodies of the batch's chunk claim checks waiting on the batch lane (received, then made visible again
        at once): what the controller sent, for a test to deliver again."""
        bodies: dict[str, str] = {}
        deadline = time.monotonic() + 10
        while len(bodies) < batch.chunks and time.monotonic() < deadline:
            for message in self.sqs.receive_message(
                QueueUrl=self.batch_queue_url, MaxNumberOfMessages=10, VisibilityTimeout=30, WaitTimeSeconds=1
            ).get("Messages", []):
                bodies[message["MessageId"]] = message["Body"]
                self.sqs.change_message_visibility(
                    QueueUrl=self.batch_queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
        assert len(bodies) == batch.chunks, f"{len(bodies)} of {batch.chunks} chunk claim checks found queued"
        return sorted(bodies.values(), key=lambda b: json.loads(b)["chunk"])

    # --- reading ----------------------------------------------------------------------------------------------------

    def record(self, batch: Submitted | str) -> BatchRecord:
        record = self.store.get_batch(batch if isinstance(batch, str) else batch.batch_id)
        assert record is not None
        return record

    def wait_status(self, batch_id: str, *statuses: BatchStatus, timeout_s: float = 60.0) -> BatchRecord:
        """The batch once it is in one of ``statuses``; AssertionError (with its status) after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.record(batch_id)
            if record.status in statuses:
                return record
            if record.status.is_final or time.monotonic() > deadline:
                raise AssertionError(
                    f"batch {batch_id} is {record.status.value} (errors {record.errors}), not one of "
                    f"{[s.value for s in statuses]}"
                )
            time.sleep(0.1)

    def wait_final(self, batch: Submitted, timeout_s: float = 60.0) -> BatchRecord:
        """The batch once the controller has finalized it (completed, cancelled or expired)."""
        return self.wait_status(
            batch.batch_id, BatchStatus.COMPLETED, BatchStatus.CANCELLED, BatchStatus.EXPIRED, timeout_s=timeout_s
        )

    def file_lines(self, file_id: str | None) -> list[dict[str, Any]]:
        """A batch output or error file's lines, read as the Files API serves them (none for no file)."""
        if file_id is None:
            return []
        record = self.service.get_file(TENANT, file_id)
        data = self.s3.get_object(Bucket=self.config.bucket_name, Key=record.key)["Body"].read()
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def files(self, record: BatchRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """A final batch's output file lines and error file lines."""
        return self.file_lines(record.output_file_id), self.file_lines(record.error_file_id)

    def part(self, batch: Submitted, chunk: int, kind: str) -> list[dict[str, Any]] | None:
        """A chunk's output or error part as JSON lines; None when it is not written."""
        key = settings.batch_part_key(batch.tenant, batch.batch_id, chunk, kind)
        try:
            data = self.s3.get_object(Bucket=self.config.bucket_name, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def versions(self, key: str) -> int:
        """Writes of an object: the deployed bucket is versioned, so each write is a version."""
        listing = self.s3.list_object_versions(Bucket=self.config.bucket_name, Prefix=key)
        return sum(1 for v in listing.get("Versions", []) if v["Key"] == key)

    def batch_keys(self, batch: Submitted) -> list[str]:
        """Every object the worker wrote for the batch (parts and results objects)."""
        prefix = f"{settings.BATCH_PREFIX}{batch.tenant}/{batch.batch_id}/"
        listing = self.s3.list_object_versions(Bucket=self.config.bucket_name, Prefix=prefix)
        return sorted({v["Key"] for v in listing.get("Versions", [])})

    def batch_queue_depth(self) -> int:
        return self.fstack.queue_depth(self.batch_queue_url)

    def empty(self) -> None:
        """Delete what a test left on the batch lane (the control queue is the deployed controller's to empty)."""
        deadline = time.monotonic() + 5
        while self.fstack.queue_depth(self.batch_queue_url) and time.monotonic() < deadline:
            for message in self.sqs.receive_message(
                QueueUrl=self.batch_queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", []):
                self.sqs.delete_message(QueueUrl=self.batch_queue_url, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture(scope="session")
def bstack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[BatchStack]:
    fstack = FaultStack(tmp_path_factory.mktemp("batch-logs"), local_assembly).start()
    # In-process workers and the BatchService build their clients without an endpoint (async_inference.aws.client):
    # point them at moto.
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
