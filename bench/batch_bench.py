"""The batch figures of ``make bench`` (bench/run.py): a 5,000-line batch through a worker with both lanes, into the
simulated engine, created, planned and finalized by the real API side: ``BatchService`` (what ``POST /v1/files`` and
``POST /v1/batches`` run) and ``BatchController`` (the template's controller function's code, with that function's
settings) over the template's batch table and queues.

The controller runs in this process, not in its function's process, so that its requests are counted with the rest:
the template's mapping on the control queue is paused meanwhile (``LocalDeployment.event_source_paused``) and a thread
here plays it, receiving as many messages at a time as the mapping's BatchSize and deleting each once handled.

- batch_requests_per_line: AWS requests per line end to end (the file upload and the batch create, the controller's
  plan, every chunk, the finalize; counted at the botocore level by the side that made them: ``api``, ``controller``
  including its queue's receives and deletes, idle long polls too, and ``worker``), for the batch alone;
- batch_engine_utilisation: engine tokens/s over its ceiling (capacity / step time) from the worker's start until its
  last chunk left the queue, the batch alone;
- interactive_wait_under_batch_p95_s: submit to generation start of interactive jobs sent at a steady rate through
  the API while the same batch runs; the goal is 2 x the idle pickup latency plus one engine step. Beside it, the
  same jobs at the same rate through the same kind of worker without a batch, just before (``without_batch``): the
  machine's other load moves both, and the two side by side say what the batch adds. Load averages are recorded.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from async_inference import settings
from async_inference.aws import client
from async_inference.batches.aws import ControlQueue, FileObjects
from async_inference.batches.controller import BatchController
from async_inference.batches.models import BatchCreate, BatchRecord, BatchStatus
from async_inference.batches.service import BatchService
from async_inference.batches.store import BatchStore
from async_inference.config import ServiceSettings
from async_inference.schemas import BatchControl
from async_inference.served_models import ServedModels
from async_inference_client import Client
from gpu_worker.engines.base import Engine
from gpu_worker.worker import Worker, WorkerConfig
from local_runtime.stack import LocalDeployment
from local_runtime.worker_thread import WorkerThread

# The simulated GPU of the batch runs: 64 sequences per step as in the other figures, but 20 ms a step and lines of
# at most 64 tokens (the Azure trace's lengths, cut: mean 61), so that 5,000 lines take about 100 s at the ceiling
# of 3,200 tokens/s rather than the quarter of an hour the uncut trace would.
BATCH_STEP_S = 0.02
BATCH_MAX_TOKENS = 64
INTERACTIVE_RATE_PER_S = 2.0  # interactive jobs sent while the batch runs
INTERACTIVE_TOKENS = 16
TENANT = "bench"
# Thread names the request counter (bench.instruments.RequestCounter) attributes to the API side and to the controller.
API_THREAD = "batch-api"
CONTROLLER_THREAD = "batch-controller"
LONG_POLL_S = 20  # what Lambda's SQS pollers wait for a message


@dataclass
class BatchBench:
    """The stack's batch resources, the API's BatchService and the controller over them."""

    stack: LocalDeployment
    service: BatchService
    controller: BatchController
    batch_queue_url: str
    control_queue_url: str
    table_name: str
    control_batch_size: int

    @classmethod
    def create(cls, stack: LocalDeployment) -> BatchBench:
        """Over the deployed stack's outputs; the controller with its function's environment from the template. The
        process must be a client of the stack (``stack.export_env()``)."""
        resources = stack.resources
        assert resources is not None and stack.deployment is not None
        function = stack.event_source_function(resources.batch_control_queue_url)
        controller_settings = ServiceSettings.load(**function.environment)
        service = BatchService(
            store=BatchStore(resources.batch_table_name),
            files=FileObjects(resources.config.bucket_name),
            control=ControlQueue(resources.batch_control_queue_url),
            served=ServedModels.of(controller_settings.served_models),
        )
        mapping = next(
            m.properties
            for m in stack.deployment.of_type("AWS::Lambda::EventSourceMapping").values()
            if stack.deployment.function_by_arn(m.properties["FunctionName"]) == function.logical_id
        )
        return cls(
            stack,
            service,
            BatchController.from_settings(controller_settings),
            resources.batch_queue_url,
            resources.batch_control_queue_url,
            resources.batch_table_name,
            int(mapping.get("BatchSize", 10)),
        )

    def store(self) -> BatchStore:
        return BatchStore(self.table_name)

    def worker(self, engine: Engine) -> WorkerThread:
        config = WorkerConfig(
            service=ServiceSettings.load().service,
            batch_queue_url=self.batch_queue_url,
            control_queue_url=self.control_queue_url,
        )
        return WorkerThread(Worker(config, engine, batches=self.store()))

    def submit(self, lengths: list[int]) -> str:
        """``POST /v1/files`` then ``POST /v1/batches``, as the API runs them; the batch's id (its plan message is on
        the control queue)."""
        lines = [
            json.dumps(
                {
                    "custom_id": f"line-{i}",
                    "method": "POST",
                    "url": settings.BATCH_ENDPOINT,
                    "body": {
                        "model": "sim",
                        "max_tokens": n,
                        "messages": [{"role": "user", "content": " ".join(f"w{j}" for j in range(n))}],
                    },
                }
            )
            for i, n in enumerate(lengths)
        ]
        data = ("\n".join(lines) + "\n").encode()
        file = self.service.create_file(TENANT, filename="bench.jsonl", purpose="batch", data=data)
        return self.service.create_batch(
            TENANT, BatchCreate(input_file_id=file.id, endpoint=settings.BATCH_ENDPOINT, completion_window="24h")
        ).id

    def control_until_final(self, batch_id: str, timeout_s: float) -> BatchRecord:
        """The controller's mapping: receive control messages (BatchSize at a time, long polls), hand each to the
        controller, delete it; until the batch is final."""
        sqs, deadline = client("sqs"), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            messages = sqs.receive_message(
                QueueUrl=self.control_queue_url,
                MaxNumberOfMessages=self.control_batch_size,
                WaitTimeSeconds=LONG_POLL_S,
            ).get("Messages", [])
            final = None
            for message in messages:
                record = self.controller.handle(BatchControl.model_validate_json(message["Body"]))
                if record is not None and record.id == batch_id and record.status.is_final:
                    final = record
            if messages:
                sqs.delete_message_batch(
                    QueueUrl=self.control_queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
            if final is not None:
                return final
        raise TimeoutError(f"batch {batch_id} not final after {timeout_s} s")


def in_thread(name: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a thread named ``name`` (the request counter tells sides apart by thread name)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            result["error"] = exc

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def batch_run(
    bench: BatchBench,
    engine: Any,
    lengths: list[int],
    *,
    counter: Any | None = None,
    api: Client | None = None,
    timeout_s: float = 900,
) -> dict[str, Any]:
    """One batch of lines of these output lengths, created by the API side, planned by the controller, through one
    worker with both lanes, finalized by the controller. With ``api``, interactive jobs are sent through it at a
    steady rate while the batch's chunks are still queued."""
    ceiling = engine.inner.stats.ceiling_tokens_per_s
    if counter is not None:
        counter.reset()
    load_before = os.getloadavg()[0]
    batch_id = in_thread(API_THREAD, lambda: bench.submit(lengths))
    controlled: dict[str, Any] = {}

    def control() -> None:
        try:
            controlled["record"] = bench.control_until_final(batch_id, timeout_s)
        except BaseException as exc:  # reported by the caller
            controlled["error"] = exc

    controller = threading.Thread(name=CONTROLLER_THREAD, target=control)
    controller.start()
    store = bench.store()
    while (planned := store.get_batch(batch_id)) is not None and planned.status is BatchStatus.VALIDATING:
        if not controller.is_alive():
            raise RuntimeError(f"the controller stopped before planning {batch_id}: {controlled.get('error')}")
        time.sleep(0.1)
    assert planned is not None and planned.chunk_count, f"batch {batch_id} not planned: {planned}"
    chunks = planned.chunk_count
    submitted: dict[str, float] = {}
    samples: list[tuple[float, int, int]] = []  # (t, engine tokens, chunks received)
    start = time.perf_counter()
    with bench.worker(engine) as worker:
        sender = None
        if api is not None:
            sender = threading.Thread(
                target=_send_interactive,
                name="api-interactive",
                args=(api, submitted, lambda: _received(worker) < chunks),
                daemon=True,
            )
            sender.start()
        while controller.is_alive():
            samples.append((time.perf_counter() - start, engine.inner.stats.tokens, _received(worker)))
            time.sleep(0.25)
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError("the batch run did not finish")
        elapsed = time.perf_counter() - start
        if sender is not None:
            sender.join(timeout=30)
        preemptions = worker.admission.preemptions
    if "record" not in controlled:
        raise RuntimeError(f"the controller failed: {controlled.get('error')!r}")
    final: BatchRecord = controlled["record"]
    backlogged = [s for s in samples if s[2] < chunks]
    t_end, tokens_end, _ = backlogged[-1] if backlogged else samples[-1]
    result: dict[str, Any] = {
        "lines": len(lengths),
        "chunks": chunks,
        "tokens": engine.inner.stats.tokens,
        "elapsed_s": round(elapsed, 3),
        "ceiling_tokens_per_s": ceiling,
        "utilisation_while_backlogged": tokens_end / t_end / ceiling if t_end else None,
        "backlogged_s": round(t_end, 3),
        "batch_fullness": engine.inner.stats.utilisation,
        "preemptions": preemptions,
        "batch": {
            "status": final.status.value,
            "completed": final.completed,
            "failed": final.failed,
            "total": final.total,
            "output_file_id": final.output_file_id,
            "error_file_id": final.error_file_id,
        },
    }
    if final.status is not BatchStatus.COMPLETED or final.completed != len(lengths):
        raise RuntimeError(f"the batch ended {result['batch']}, not completed with every line")
    if counter is not None:
        by_operation = {f"{side}:{op}": n for (side, op), n in sorted(counter.counts.items())}
        sides = {side: counter.total(side) for side in ("batch_api", "batch_controller", "worker")}
        result.update(
            api_requests=sides["batch_api"],
            controller_requests=sides["batch_controller"],
            worker_requests=sides["worker"],
            requests_per_line=sum(sides.values()) / len(lengths),
            by_operation=by_operation,
        )
    if api is not None:
        result.update(_waits(engine, submitted))
    result["load_average"] = [load_before, os.getloadavg()[0]]
    return result


def interactive_run(bench: BatchBench, engine: Any, api: Client, seconds: float) -> dict[str, Any]:
    """Interactive jobs at INTERACTIVE_RATE_PER_S for ``seconds`` through a worker with the batch lane and no batch:
    the control for the wait under a batch."""
    submitted: dict[str, float] = {}
    load_before = os.getloadavg()[0]
    with bench.worker(engine):
        until = time.perf_counter() + seconds
        _send_interactive(api, submitted, lambda: time.perf_counter() < until)
        time.sleep(1.0)  # the last ones reach the engine
    return {**_waits(engine, submitted), "load_average": [load_before, os.getloadavg()[0]]}


def _waits(engine: Any, submitted: dict[str, float]) -> dict[str, Any]:
    waits = sorted(engine.started[job_id] - at for job_id, at in submitted.items() if job_id in engine.started)
    return {
        "interactive_jobs": len(submitted),
        "interactive_started": len(waits),
        "interactive_wait_p50_s": statistics.median(waits) if waits else None,
        "interactive_wait_p95_s": _p95(waits),
        "interactive_waits_s": [round(w, 4) for w in waits],
        "stages": _stages(engine, submitted),
    }


def _p95(values: list[float]) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.95 * len(values)))] if values else None


def _stages(engine: Any, submitted: dict[str, float]) -> dict[str, Any]:
    """Where an interactive job's wait went, from its record: submit to running (its ``started_at``, taken once it
    holds an engine slot: the API, SQS, the worker's receive, the payload read and the wait for the slot), then
    running to the engine (the running state write before the generation). p50 and p95 of each."""
    from async_inference.aws import JobStore

    wall_minus_perf = time.time() - time.perf_counter()
    jobs = {}
    ids = [job_id for job_id in submitted if job_id in engine.started]
    store = JobStore(ServiceSettings.load().table_name)
    for start in range(0, len(ids), 100):
        jobs.update(store.get_many(ids[start : start + 100]))
    to_running, to_engine = [], []
    for job_id, job in jobs.items():
        if job.started_at is None:
            continue
        running = job.started_at.timestamp() - wall_minus_perf
        to_running.append(running - submitted[job_id])
        to_engine.append(engine.started[job_id] - running)
    return {
        name: {"p50_s": statistics.median(v) if v else None, "p95_s": _p95(v)}
        for name, v in (("submit_to_running", to_running), ("running_to_engine", to_engine))
    }


def _received(worker: Worker) -> int:
    return worker.chunks.chunks_started if worker.chunks is not None else 0


def _send_interactive(api: Client, submitted: dict[str, float], batch_queued: Callable[[], bool]) -> None:
    """Interactive jobs at INTERACTIVE_RATE_PER_S while the batch still has chunks on the queue."""
    body = {
        "model": "sim",
        "max_tokens": INTERACTIVE_TOKENS,
        "messages": [{"role": "user", "content": " ".join(f"i{j}" for j in range(INTERACTIVE_TOKENS))}],
    }
    time.sleep(2.0)  # the batch has filled the engine by now
    next_at = time.perf_counter()
    while batch_queued():
        before = time.perf_counter()
        job_id = api.submit(body).job_id
        submitted[job_id] = before
        next_at += 1.0 / INTERACTIVE_RATE_PER_S
        time.sleep(max(0.0, next_at - time.perf_counter()))
