"""The worker keeps the engine full and its messages hidden: batching and visibility extension, against moto server."""

from __future__ import annotations

import time
from typing import Any

import pytest

from async_inference.aws import JobQueue
from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import Engine, Generation
from gpu_worker.engines.echo import EchoEngine
from gpu_worker.worker import Worker, WorkerConfig
from local_runtime.worker_thread import WorkerThread
from tests.e2e.conftest import chat

pytestmark = pytest.mark.e2e


class RecordingQueue(JobQueue):
    """The real queue adapter, remembering the batched calls the worker makes."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.receives: list[int] = []  # messages asked for per ReceiveMessage
        self.received: list[int] = []  # messages returned per ReceiveMessage
        self.extensions: list[tuple[float, list[str], int]] = []  # (time, receipt handles, timeout)
        self.deletes: list[int] = []
        self.bodies: list[str] = []  # every body received

    def receive(self, *, max_messages: int, wait_s: int, **kwargs: Any):  # type: ignore[override]
        messages = super().receive(max_messages=max_messages, wait_s=wait_s, **kwargs)
        self.receives.append(max_messages)
        self.received.append(len(messages))
        self.bodies.extend(m.body for m in messages)
        return messages

    def change_visibility_batch(self, receipt_handles: list[str], timeout_s: int) -> list[str]:
        self.extensions.append((time.monotonic(), list(receipt_handles), timeout_s))
        return super().change_visibility_batch(receipt_handles, timeout_s)

    def delete_batch(self, receipt_handles: list[str]) -> list[str]:
        self.deletes.append(len(receipt_handles))
        return super().delete_batch(receipt_handles)


class Concurrency(Engine):
    """Echo with a delay, counting how many requests are inside the engine at once."""

    def __init__(self, capacity: int, delay_s: float) -> None:
        self.inner = EchoEngine(capacity=capacity, delay_s=delay_s)
        self.now = 0
        self.peak = 0
        self.seen: list[str] = []

    @property
    def capacity(self) -> int:
        return self.inner.capacity

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        self.seen.append(request_id)
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.inner.generate(request_id, request)
        finally:
            self.now -= 1


def worker_for(engine: Engine, queue: RecordingQueue, **config: Any) -> Worker:
    service_config = ServiceSettings.load().service
    base = JobService.from_config(service_config)
    service = JobService(store=base.store, blobs=base.blobs, queue=queue, notifier=base.notifier)
    return Worker(WorkerConfig(service=service_config, receive_wait_s=1, **config), engine, service=service)


def held(worker: Worker, job_id: str) -> bool:
    """Whether the worker still holds a message of the job (running it, or deciding what its copy comes to)."""
    return any(flight.job_id == job_id for flight in list(worker._inflight.values()))


def test_worker_fills_the_engine_from_a_backlog_with_batched_receives_and_deletes(stack, api):
    # GIVEN a backlog of 40 jobs and an engine that batches 16 (each generation long enough that the worker's I/O,
    # even on a loaded machine, keeps up with it)
    ids = [api.submit(chat(f"job {i} words")).job_id for i in range(40)]
    engine = Concurrency(capacity=16, delay_s=2.0)
    queue = RecordingQueue(stack.resources.config.queue_url)
    # WHEN one worker runs them
    with WorkerThread(worker_for(engine, queue)) as worker:
        deadline = time.monotonic() + 120
        while worker.jobs_finished < 40 and time.monotonic() < deadline:
            time.sleep(0.1)
    # THEN the engine held its full batch at once, never more
    assert engine.peak == 16
    # AND messages came in batches of up to 10 and left in batched deletes, far fewer calls than jobs
    assert max(queue.received) == 10
    assert all(asked <= 10 for asked in queue.receives)
    assert sum(queue.deletes) >= 40 and len(queue.deletes) < sum(queue.deletes) / 2
    assert all(api.get(i).status == "succeeded" for i in ids)


def test_long_generation_keeps_its_message_hidden_and_runs_once(stack, api):
    # GIVEN a job that generates for 8 s, and a worker whose messages would reappear after 3 s without a heartbeat
    job = api.submit(chat("slow job"))
    queue = RecordingQueue(stack.resources.config.queue_url)
    worker = worker_for(EchoEngine(delay_s=8.0), queue, visibility_timeout_s=3, heartbeat_interval_s=0.5)
    peeker = JobQueue(stack.resources.config.queue_url)
    seen_by_another: list[str] = []
    # WHEN another consumer keeps polling the queue while it runs
    with WorkerThread(worker) as running:
        deadline = time.monotonic() + 30
        while api.get(job.job_id).status != "running" and time.monotonic() < deadline:
            time.sleep(0.1)  # before the worker holds it, anyone may see it
        while running.jobs_finished < 1 and time.monotonic() < deadline:
            for message in peeker.receive(max_messages=10, wait_s=0, visibility_timeout_s=0):
                if job.job_id in message.body:
                    seen_by_another.append(message.message_id)
            time.sleep(0.2)
        finished_at = time.monotonic()
        beats = running.beats
        while running.beats < beats + 3 and time.monotonic() < deadline:  # three more heartbeats, nothing in flight
            time.sleep(0.05)
        assert running.beats >= beats + 3
    # THEN nobody else saw the message, the job ran once, and the heartbeat extended it in batched calls
    assert seen_by_another == []
    final = api.get(job.job_id)
    assert final.status == "succeeded" and final.attempts == 1
    during = [e for e in queue.extensions if e[2] == 3 and e[0] < finished_at]
    assert len(during) >= 4, queue.extensions
    # AND once the job ended its message was no longer extended
    assert not [e for e in queue.extensions if e[0] > finished_at + 0.2 and e[2] > 0]


def test_job_cancelled_while_waiting_for_an_engine_slot_never_reaches_the_engine(stack, api):
    # GIVEN an engine with one slot, busy with a first job, and a second job held by the worker, waiting for the slot
    engine = Concurrency(capacity=1, delay_s=4.0)
    queue = RecordingQueue(stack.resources.config.queue_url)
    worker = worker_for(engine, queue, heartbeat_interval_s=0.3)
    with WorkerThread(worker) as running:
        first = api.submit(chat("first"))
        deadline = time.monotonic() + 30
        while first.job_id not in engine.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting = api.submit(chat("second"))
        while (
            not any(f.job_id == waiting.job_id for f in list(running._inflight.values()))
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert api.get(waiting.job_id).status == "queued", "held by the worker, not in the engine: still queued"
        # WHEN the client cancels the waiting job
        api.cancel(waiting.job_id)
        # (its message settled, the worker holds it no more: from then on it can never reach the engine)
        while (running.jobs_finished < 1 or held(running, waiting.job_id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not held(running, waiting.job_id)
    # THEN the engine never saw it, and it stays cancelled; the first job was not disturbed
    assert engine.seen == [first.job_id]
    assert api.get(waiting.job_id).status == "cancelled"
    assert api.get(first.job_id).status == "succeeded"


def test_a_second_delivery_of_a_job_this_worker_is_running_does_not_run_it_again(stack, api):
    # GIVEN a worker running a slow job
    engine = Concurrency(capacity=4, delay_s=3.0)
    queue = RecordingQueue(stack.resources.config.queue_url)
    with WorkerThread(worker_for(engine, queue)) as running:
        job = api.submit(chat("only once here"))
        deadline = time.monotonic() + 30
        while job.job_id not in engine.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        # WHEN SQS delivers its claim check again meanwhile (at-least-once delivery)
        claim = JobService.from_config(ServiceSettings.load().service).store.get(job.job_id).claim_check()
        queue.send(claim)
        while (running.jobs_finished < 1 or held(running, job.job_id)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not held(running, job.job_id)
    # THEN the engine ran the job once, and it succeeded on its first attempt
    assert engine.seen == [job.job_id]
    final = api.get(job.job_id)
    assert final.status == "succeeded" and final.attempts == 1
