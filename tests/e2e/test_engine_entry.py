"""A job is running only once it is in the engine: held in the worker's prefetch buffer, it stays queued (issue #13,
defect 5: with two engine slots twelve jobs showed running, one of them for 62 s for 20 s of generation)."""

from __future__ import annotations

import time

import pytest

from async_inference.config import ServiceSettings
from async_inference.service import JobService
from local_runtime.worker_thread import WorkerThread
from tests.e2e.conftest import chat
from tests.e2e.test_worker_batching import Concurrency, RecordingQueue, worker_for

pytestmark = pytest.mark.e2e

DELAY_S = 1.5


def test_jobs_held_beyond_the_engines_slots_stay_queued_and_run_for_their_generation_only(stack, api):
    # GIVEN twelve jobs, an engine with two slots (1.5 s a generation) and a worker that holds ten more messages
    ids = [api.submit(chat(f"job {i} of twelve")).job_id for i in range(12)]
    engine = Concurrency(capacity=2, delay_s=DELAY_S)
    queue = RecordingQueue(stack.resources.config.queue_url)
    store = JobService.from_config(ServiceSettings.load().service).store
    samples: list[tuple[int, int]] = []  # (messages the worker held, jobs running)
    # WHEN one worker runs them, and their states are read every 0.2 s
    with WorkerThread(worker_for(engine, queue, prefetch=10, heartbeat_interval_s=0.5)) as worker:
        deadline = time.monotonic() + 90
        while worker.jobs_finished < 12 and time.monotonic() < deadline:
            held = len(worker._inflight)
            jobs = store.get_many(ids)
            samples.append((held, sum(1 for job in jobs.values() if job.status.value == "running")))
            time.sleep(0.2)
    # THEN no more jobs were running at any time than the engine has slots
    assert max(running for _, running in samples) <= 2, samples
    # AND the worker did hold more than that meanwhile: those jobs were queued while they waited
    assert any(held > 2 for held, _ in samples), samples
    # AND every job ran for its generation, not for its wait in the buffer (started_at is when it entered the engine)
    jobs = store.get_many(ids)
    assert all(job.status.value == "succeeded" for job in jobs.values())
    run_s = sorted((job.finished_at - job.started_at).total_seconds() for job in jobs.values())
    assert run_s[-1] < 2 * DELAY_S, run_s
    assert engine.peak == 2
