"""A job is running only once it is in the engine: held in the worker's prefetch buffer, it stays queued (issue #13,
defect 5: with two engine slots twelve jobs showed running, one of them for 62 s for 20 s of generation)."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest, utcnow
from gpu_worker.engines.base import Generation
from local_runtime.worker_thread import WorkerThread
from tests.e2e.conftest import chat
from tests.e2e.test_worker_batching import Concurrency, RecordingQueue, worker_for

pytestmark = pytest.mark.e2e

DELAY_S = 1.5


class Entered(Concurrency):
    """Remembers when each job reached the engine."""

    def __init__(self, capacity: int, delay_s: float) -> None:
        super().__init__(capacity, delay_s)
        self.entered: dict[str, dt.datetime] = {}

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        self.entered[request_id] = utcnow()
        return await super().generate(request_id, request)


def test_jobs_held_beyond_the_engines_slots_stay_queued_and_run_for_their_generation_only(stack, api):
    # GIVEN twelve jobs, an engine with two slots (1.5 s a generation) and a worker that holds ten more messages
    ids = [api.submit(chat(f"job {i} of twelve")).job_id for i in range(12)]
    engine = Entered(capacity=2, delay_s=DELAY_S)
    queue = RecordingQueue(stack.resources.config.queue_url)
    store = JobService.from_config(ServiceSettings.load().service).store
    samples: list[tuple[int, int]] = []  # (messages the worker held, jobs queued)
    # WHEN one worker runs them, and their states are read every 0.2 s
    with WorkerThread(worker_for(engine, queue, prefetch=10, heartbeat_interval_s=0.5)) as worker:
        deadline = time.monotonic() + 90
        while worker.jobs_finished < 12 and time.monotonic() < deadline:
            held = len(worker._inflight)
            jobs = store.get_many(ids)
            samples.append((held, sum(1 for job in jobs.values() if job.status.value == "queued")))
            time.sleep(0.2)
    jobs = store.get_many(ids)
    assert all(job.status.value == "succeeded" for job in jobs.values())
    assert engine.peak == 2
    # THEN each job became running as it entered the engine, not when the worker received it (which, for the ten held
    # beyond the two slots, is one to five generations earlier: a bound of one generation, as a loaded host took 0.9 s)
    late = {job.job_id: (engine.entered[job.job_id] - job.started_at).total_seconds() for job in jobs.values()}
    assert all(0 <= s < DELAY_S for s in late.values()), late
    # AND the jobs the worker held beyond its two slots were queued meanwhile
    assert any(held >= 6 and queued >= held - 2 - 2 for held, queued in samples), samples
    # AND every job ran for its generation, not for its wait in the buffer
    run_s = sorted((job.finished_at - job.started_at).total_seconds() for job in jobs.values())
    assert run_s[-1] < 2 * DELAY_S, run_s
