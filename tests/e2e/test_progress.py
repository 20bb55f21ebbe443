"""A running job's progress: how many requests a progress beat makes (measured on the clients' own calls), and the
tokens so far on the job while it runs."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from async_inference.aws import JobEvents, JobStore
from async_inference.jobs import JobStatus
from async_inference.schemas import JobProgress, utcnow
from gpu_worker.engines.echo import EchoEngine
from gpu_worker.progress import ProgressReporter
from local_runtime.stack import LocalDeployment
from local_runtime.worker_thread import WorkerThread
from tests.e2e.conftest import chat
from tests.e2e.test_worker_batching import RecordingQueue, worker_for

pytestmark = pytest.mark.e2e


class Tokens(EchoEngine):
    """An engine whose running requests' token counts the test sets."""

    def __init__(self) -> None:
        super().__init__(capacity=64)
        self.counts: dict[str, int] = {}

    def tokens_so_far(self, request_id: str) -> int | None:
        return self.counts.get(request_id)


def count_requests(*clients: Any) -> Counter[str]:
    """Every request the clients send, by operation name, counted as botocore sends it."""
    sent: Counter[str] = Counter()
    for client in clients:
        client.meta.events.register(
            "before-call", lambda model, **_: sent.update([f"{model.service_model.service_name}.{model.name}"])
        )
    return sent


async def _io(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args))


def test_a_beat_writes_once_per_job_whose_count_changed_and_publishes_ten_a_request(stack: LocalDeployment, api):
    # GIVEN 23 running jobs in the engine, a reporter on the deployed table and job event topic
    assert stack.resources is not None
    store = JobStore(stack.resources.config.table_name)
    events = JobEvents(stack.resources.outputs["JobEventTopicArn"])
    jobs = []
    for i in range(23):
        job_id = api.submit(chat(f"progress {i}")).job_id
        jobs.append(
            store.transition(
                job_id,
                JobStatus.RUNNING,
                started_at=utcnow(),
                progress=JobProgress(completion_tokens=0, updated_at=utcnow()),
            )
        )
    engine = Tokens()
    reporter = ProgressReporter(engine, store, events, interval_s=1, io=_io)
    for job in jobs:
        reporter.track(job)
    sent = count_requests(store._dynamodb.meta.client, events._sns)

    # WHEN every job generated tokens, and a beat runs
    engine.counts = {job.job_id: 5 for job in jobs}
    first = asyncio.run(reporter.beat())
    after_first = Counter(sent)
    # THEN it made one UpdateItem per job and one PublishBatch per ten
    assert (first.jobs, first.updates, first.publishes) == (23, 23, 3)
    assert after_first == {"dynamodb.UpdateItem": 23, "sns.PublishBatch": 3}

    # WHEN nothing changed by the next beat THEN it sends nothing
    assert asyncio.run(reporter.beat()).jobs == 0 and sent == after_first

    # WHEN three jobs moved on, one of which was cancelled meanwhile
    for job in jobs[:3]:
        engine.counts[job.job_id] = 9
    api.cancel(jobs[2].job_id)
    third = asyncio.run(reporter.beat())
    # THEN three writes, of which the cancelled job's was refused, and only the two running jobs' events went out
    assert (third.jobs, third.updates, third.publishes) == (3, 3, 1)
    assert sent["dynamodb.UpdateItem"] - after_first["dynamodb.UpdateItem"] == 3
    assert [store.get(job.job_id).progress.completion_tokens for job in jobs[:2]] == [9, 9]
    assert store.get(jobs[2].job_id).status is JobStatus.CANCELLED
    for job in jobs[:2] + jobs[3:]:  # their claim checks are still queued: no later worker is to run them
        api.cancel(job.job_id)


def test_the_job_shows_its_tokens_so_far_while_it_runs_and_not_once_final(stack: LocalDeployment, api):
    # GIVEN a worker whose echo engine takes 3 s for a 30-word answer, with a progress beat every 0.3 s
    queue = RecordingQueue(stack.resources.config.queue_url)
    worker = worker_for(EchoEngine(delay_s=3.0), queue, progress_interval_s=0.3)
    seen: list[int] = []
    with WorkerThread(worker) as running:
        job = api.submit(chat(" ".join(f"w{i}" for i in range(30))))
        deadline = time.monotonic() + 30
        # WHEN the client reads the job while it runs
        while running.jobs_finished < 1 and time.monotonic() < deadline:
            view = api.get(job.job_id)
            if view.status.value == "running" and view.progress is not None:
                seen.append(view.progress.completion_tokens)
            time.sleep(0.2)
    # THEN it saw the count rise, never past the answer's 30 tokens
    assert len(set(seen)) >= 3 and seen == sorted(seen) and seen[-1] <= 30, seen
    # AND the final view has the usage instead
    final = api.get(job.job_id)
    assert final.status.value == "succeeded" and final.progress is None and final.usage.completion_tokens == 30
