"""The batch figures of ``make bench`` (bench/run.py): a 5,000-line batch through a worker with both lanes, into the
simulated engine, driven through the stand-in API side (``bench.batch_standin``) until the real one is merged.

- batch_requests_per_line: AWS requests per line end to end (the upload, the plan, every chunk, the finalize;
  counted at the botocore level, driver and worker side), for the batch alone;
- batch_engine_utilisation: engine tokens/s over its ceiling (capacity / step time) from the worker's start until its
  last chunk left the queue, the batch alone;
- interactive_wait_under_batch_p95_s: submit to generation start of interactive jobs sent at a steady rate through
  the API while the same batch runs; the goal is 2 x the idle pickup latency plus one engine step. Beside it, the
  same jobs at the same rate through the same kind of worker without a batch, just before (``without_batch``): the
  machine's other load moves both, and the two side by side say what the batch adds. Load averages are recorded.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from async_inference.aws import client
from async_inference.client import Client
from async_inference.config import ServiceSettings
from async_inference.schemas import BatchControl
from bench.batch_standin import (
    BatchResources,
    StandInBatchStore,
    SubmittedBatch,
    create_batch_resources,
    finalize_batch,
    input_line,
    submit_batch,
)
from gpu_worker.engines.base import Engine
from gpu_worker.worker import Worker, WorkerConfig
from local_runtime.worker_thread import WorkerThread

# The simulated GPU of the batch runs: 64 sequences per step as in the other figures, but 20 ms a step and lines of
# at most 64 tokens (the Azure trace's lengths, cut: mean 61), so that 5,000 lines take about 100 s at the ceiling
# of 3,200 tokens/s rather than the quarter of an hour the uncut trace would.
BATCH_STEP_S = 0.02
BATCH_MAX_TOKENS = 64
INTERACTIVE_RATE_PER_S = 2.0  # interactive jobs sent while the batch runs
INTERACTIVE_TOKENS = 16
TENANT = "bench"


@dataclass
class BatchBench:
    """The batch lane's resources in the bench's stack, and a driver that plays the API side."""

    resources: BatchResources
    bucket: str

    @classmethod
    def create(cls) -> BatchBench:
        return cls(create_batch_resources(client("sqs"), client("dynamodb")), ServiceSettings.load().bucket_name)

    def store(self) -> StandInBatchStore:
        return StandInBatchStore(self.resources.table_name)

    def worker(self, engine: Engine) -> WorkerThread:
        config = WorkerConfig(service=ServiceSettings.load().service, batch_queue_url=self.resources.batch_queue_url,
                              control_queue_url=self.resources.control_queue_url)
        return WorkerThread(Worker(config, engine, batches=self.store()))

    def submit(self, lengths: list[int]) -> SubmittedBatch:
        lines = [
            input_line(f"line-{i}", {"model": "sim", "max_tokens": n,
                                     "messages": [{"role": "user", "content": " ".join(f"w{j}" for j in range(n))}]})
            for i, n in enumerate(lengths)
        ]
        return submit_batch(s3=client("s3"), sqs=client("sqs"), store=self.store(), bucket=self.bucket,
                            batch_queue_url=self.resources.batch_queue_url, tenant=TENANT, lines=lines)

    def finalize_when_told(self, batch: SubmittedBatch, timeout_s: float) -> dict[str, int]:
        """The controller: wait for the batch's finalize message, then concatenate its parts."""
        sqs, deadline = client("sqs"), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in sqs.receive_message(QueueUrl=self.resources.control_queue_url, MaxNumberOfMessages=10,
                                               WaitTimeSeconds=20).get("Messages", []):
                sqs.delete_message(QueueUrl=self.resources.control_queue_url, ReceiptHandle=message["ReceiptHandle"])
                if BatchControl.model_validate_json(message["Body"]).batch_id == batch.batch_id:
                    return finalize_batch(s3=client("s3"), store=self.store(), bucket=self.bucket, batch=batch)
        raise TimeoutError(f"no finalize for {batch.batch_id} in {timeout_s} s")


def in_thread(name: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a thread named ``name`` (the request counter tells sides apart by thread name: bench.run's
    DRIVER_THREAD_PREFIX is the stand-in API side)."""
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


def batch_run(bench: BatchBench, engine: Any, lengths: list[int], *, counter: Any | None = None,
              api: Client | None = None, timeout_s: float = 900) -> dict[str, Any]:
    """One batch of lines of these output lengths through one worker with both lanes. With ``api``, interactive jobs
    are sent through it at a steady rate while the batch's chunks are still queued."""
    ceiling = engine.inner.stats.ceiling_tokens_per_s
    if counter is not None:
        counter.reset()
    load_before = os.getloadavg()[0]
    batch = in_thread("batch-driver-submit", lambda: bench.submit(lengths))
    submitted: dict[str, float] = {}
    samples: list[tuple[float, int, int]] = []  # (t, engine tokens, chunks received)
    start = time.perf_counter()
    with bench.worker(engine) as worker:
        sender = None
        if api is not None:
            sender = threading.Thread(target=_send_interactive, name="api-interactive",
                                      args=(api, submitted, lambda: _received(worker) < batch.chunks), daemon=True)
            sender.start()
        finalizer: dict[str, Any] = {}
        finalize = threading.Thread(name="batch-driver-finalize", target=lambda: finalizer.update(
            counts=bench.finalize_when_told(batch, timeout_s)))
        finalize.start()
        while finalize.is_alive():
            samples.append((time.perf_counter() - start, engine.inner.stats.tokens, _received(worker)))
            time.sleep(0.25)
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError("the batch run did not finish")
        elapsed = time.perf_counter() - start
        if sender is not None:
            sender.join(timeout=30)
        preemptions = worker.admission.preemptions
    if "counts" not in finalizer:
        raise RuntimeError("the finalize failed (see its thread's traceback)")
    backlogged = [s for s in samples if s[2] < batch.chunks]
    t_end, tokens_end, _ = backlogged[-1] if backlogged else samples[-1]
    result: dict[str, Any] = {
        "lines": len(lengths), "chunks": batch.chunks, "tokens": engine.inner.stats.tokens,
        "elapsed_s": round(elapsed, 3), "ceiling_tokens_per_s": ceiling,
        "utilisation_while_backlogged": tokens_end / t_end / ceiling if t_end else None,
        "backlogged_s": round(t_end, 3), "batch_fullness": engine.inner.stats.utilisation,
        "preemptions": preemptions, "files": finalizer["counts"],
    }
    if counter is not None:
        by_operation = {f"{side}:{op}": n for (side, op), n in sorted(counter.counts.items())}
        driver, worker_side = counter.total("driver"), counter.total("worker")
        result.update(driver_requests=driver, worker_requests=worker_side,
                      requests_per_line=(driver + worker_side) / len(lengths), by_operation=by_operation)
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
    return {"interactive_jobs": len(submitted), "interactive_started": len(waits),
            "interactive_wait_p50_s": statistics.median(waits) if waits else None,
            "interactive_wait_p95_s": _p95(waits), "interactive_waits_s": [round(w, 4) for w in waits],
            "stages": _stages(engine, submitted)}


def _p95(values: list[float]) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.95 * len(values)))] if values else None


def _stages(engine: Any, submitted: dict[str, float]) -> dict[str, Any]:
    """Where an interactive job's wait went, from its record: submit to its running state write (the API, SQS and the
    worker's receive), then to the engine (the state write, the payload read, the engine slot). p50 and p95 of each."""
    from async_inference.aws import JobStore

    wall_minus_perf = time.time() - time.perf_counter()
    jobs = {}
    ids = [job_id for job_id in submitted if job_id in engine.started]
    store = JobStore(ServiceSettings.load().table_name)
    for start in range(0, len(ids), 100):
        jobs.update(store.get_many(ids[start:start + 100]))
    to_running, to_engine = [], []
    for job_id, job in jobs.items():
        if job.started_at is None:
            continue
        running = job.started_at.timestamp() - wall_minus_perf
        to_running.append(running - submitted[job_id])
        to_engine.append(engine.started[job_id] - running)
    return {name: {"p50_s": statistics.median(v) if v else None, "p95_s": _p95(v)}
            for name, v in (("submit_to_running", to_running), ("running_to_engine", to_engine))}


def _received(worker: Worker) -> int:
    return worker.chunks.chunks_started if worker.chunks is not None else 0


def _send_interactive(api: Client, submitted: dict[str, float], batch_queued: Callable[[], bool]) -> None:
    """Interactive jobs at INTERACTIVE_RATE_PER_S while the batch still has chunks on the queue."""
    body = {"model": "sim", "max_tokens": INTERACTIVE_TOKENS,
            "messages": [{"role": "user", "content": " ".join(f"i{j}" for j in range(INTERACTIVE_TOKENS))}]}
    time.sleep(2.0)  # the batch has filled the engine by now
    next_at = time.perf_counter()
    while batch_queued():
        before = time.perf_counter()
        job_id = api.submit(body).job_id
        submitted[job_id] = before
        next_at += 1.0 / INTERACTIVE_RATE_PER_S
        time.sleep(max(0.0, next_at - time.perf_counter()))
