"""What the benchmarks measure with: the AWS requests made in this process by side (``RequestCounter``) and by the
stack's functions (``FunctionRequests``, recorded by moto server), an engine wrapper that times each request
(``Timed``), a worker in this process, and small waits.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import botocore.client
import requests

from async_inference.aws import client
from async_inference.config import ServiceSettings
from async_inference.schemas import ChatCompletionRequest
from async_inference_client import Client
from gpu_worker.engines.base import Engine, Generation
from gpu_worker.worker import WorkerConfig
from local_runtime.worker_thread import WorkerThread

API_KEY = "bench-api-key-0123456789"


# Threads of the local runtime that stand in for AWS event sources (S3 -> Lambda, SQS -> Lambda): their polling has
# no counterpart in a deployment, where the event source mappings are AWS's own.
LOCAL_POLLERS = ("esm-", "async-")  # local_runtime/pollers.py names its threads by these prefixes
# Threads of bench/batch_bench.py that run the API side of batches (BatchService) and the batch controller, by name
# prefix, and the side their requests count for.
BATCH_THREAD_SIDES = {"batch-api": "batch_api", "batch-controller": "batch_controller"}


class RequestCounter:
    """Counts every AWS API call made in this process, split by the side that made it: the worker (its I/O threads
    are named ``io_*``), the local event pollers, the batch bench's API side and controller (BATCH_THREAD_SIDES), and
    the API (any other thread). A thread started by a thread of the worker or of a batch side counts for that side:
    boto3's managed transfers (the controller's output file writes) run on pool threads of their own."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._original = botocore.client.BaseClient._make_api_call
        self._original_start = threading.Thread.start
        counter = self

        def counting(self_: Any, operation: str, params: dict[str, Any]) -> Any:
            side = counter.side(threading.current_thread())
            with counter._lock:
                counter.counts[(side, operation)] += 1
            return counter._original(self_, operation, params)

        def start(thread: threading.Thread) -> None:
            parent = counter.side(threading.current_thread())
            if parent != "api":
                thread._bench_side = parent  # type: ignore[attr-defined]
            counter._original_start(thread)

        botocore.client.BaseClient._make_api_call = counting  # type: ignore[method-assign]
        threading.Thread.start = start  # type: ignore[method-assign]

    @staticmethod
    def side(thread: threading.Thread) -> str:
        name = thread.name
        if name.startswith("io"):
            return "worker"
        if name.startswith(LOCAL_POLLERS):
            return "local"
        named = next((side for prefix, side in BATCH_THREAD_SIDES.items() if name.startswith(prefix)), None)
        return named or getattr(thread, "_bench_side", "api")

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def total(self, side: str | None = None) -> int:
        return sum(n for (s, _), n in self.counts.items() if side is None or s == side)


class Timed(Engine):
    """Wraps an engine: records when each request started generating, and can lower the capacity the worker sees
    (capacity 1 is the one-message-at-a-time worker)."""

    def __init__(self, inner: Engine, capacity: int | None = None) -> None:
        self.inner = inner
        self.ready = False
        self.name = inner.name
        self._capacity = capacity or inner.capacity
        self.started: dict[str, float] = {}
        self.tokens = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    async def start(self) -> None:
        await self.inner.start()
        self.ready = True

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        self.started[request_id] = time.perf_counter()
        generation = await self.inner.generate(request_id, request)
        self.tokens += generation.completion_tokens
        return generation

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    # What the worker reads of a running request: without them a streamed job's text would reach its log only whole,
    # at the end, and the bench would time the wrapper, not the service.
    def tokens_so_far(self, request_id: str) -> int | None:
        return self.inner.tokens_so_far(request_id)

    def texts_so_far(self, request_id: str) -> tuple[str, ...] | None:
        return self.inner.texts_so_far(request_id)

    async def close(self) -> None:
        await self.inner.close()


def RunningWorker(engine: Engine, receive_wait_s: int = 20, prefetch: int | None = None) -> WorkerThread:
    """A worker in this process (so that its requests can be counted and its engine inspected)."""
    config = WorkerConfig(service=ServiceSettings.load().service, receive_wait_s=receive_wait_s, prefetch=prefetch)
    return WorkerThread.for_engine(engine, config)


def submit_all(api: Client, bodies: list[dict[str, Any]], threads: int = 8) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return [job.job_id for job in pool.map(api.submit, bodies)]


def wait_until(predicate: Any, timeout_s: float, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark run did not finish in time")
        time.sleep(poll_s)


def queue_depth(queue_url: str) -> tuple[int, int]:
    attributes = client("sqs").get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]), int(attributes["ApproximateNumberOfMessagesNotVisible"])


class FunctionRequests:
    """The AWS requests the stack's Lambda functions make, which run in processes of their own (the API's, the
    authorizer's): recorded by moto server itself (its recorder, on only while ``recording``) and told apart by the
    User-Agent botocore sends from a Lambda runtime (``exec-env/AWS_Lambda_...``, from its AWS_EXECUTION_ENV)."""

    def __init__(self, moto_url: str) -> None:
        self.url = f"{moto_url}/moto-api/recorder"

    @contextmanager
    def recording(self) -> Iterator[None]:
        requests.post(f"{self.url}/reset-recording", timeout=10).raise_for_status()
        requests.post(f"{self.url}/start-recording", timeout=10).raise_for_status()
        try:
            yield
        finally:
            requests.post(f"{self.url}/stop-recording", timeout=10).raise_for_status()

    def counts(self) -> Counter[str]:
        """Requests by operation (the X-Amz-Target, the query's Action, or the method and service of a REST call)."""
        recording = requests.get(f"{self.url}/download-recording", timeout=60).text
        counts: Counter[str] = Counter()
        for line in recording.splitlines():
            entry = json.loads(line)
            headers = {name.lower(): value for name, value in entry["headers"].items()}
            if "exec-env/AWS_Lambda" not in headers.get("user-agent", ""):
                continue
            counts[_operation(entry, headers)] += 1
        return counts


def _operation(entry: dict[str, Any], headers: dict[str, str]) -> str:
    if "x-amz-target" in headers:
        return headers["x-amz-target"].rsplit(".", 1)[-1]
    query = urllib.parse.parse_qs(urllib.parse.urlparse(entry["url"]).query)
    body = (
        base64.b64decode(entry["body"]).decode("utf-8", "replace")
        if entry.get("body_encoded")
        else entry.get("body") or ""
    )
    action = query.get("Action") or urllib.parse.parse_qs(body).get("Action")
    if action:
        return action[0]
    service = headers.get("authorization", "").split("/")[3:4]  # Credential=KEY/date/region/SERVICE/aws4_request
    return f"{entry['method']} {service[0] if service else '?'}"
