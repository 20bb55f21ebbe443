"""Running jobs' progress: their tokens so far, written to each job and published as job.progress, at a bounded rate.

Every ``interval_s`` (``PROGRESS_INTERVAL_S``, 5 s) a beat asks the engine how many tokens each job inside it has
generated (``Engine.tokens_so_far``) and, for the jobs whose count changed since their last beat, makes

* one UpdateItem per job (``JobStore.record_progress``: ``SET progress``, conditional on the job still running), all of
  them at once on the worker's I/O pool, and
* one PublishBatch per ten jobs on the job event topic (``job.progress``), when the worker has that topic.

So a beat with N changed jobs costs N UpdateItems and ceil(N/10) PublishBatch requests (N is at most the engine's
capacity), and a job that generated nothing since the last beat costs nothing. DynamoDB has no batched update:
BatchWriteItem replaces whole items and cannot be conditional, and PartiQL's BatchExecuteStatement (25 updates a
request) would cut requests but not cost, since DynamoDB bills write units (one per KB of item written), not requests.
``BeatCount`` says what each beat sent; ``tests/worker/test_progress.py`` measures it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from async_inference.aws import JobEvents, JobStore
from async_inference.schemas import Job, JobActivity, JobProgress, utcnow
from gpu_worker.engines.base import Engine

logger = logging.getLogger("gpu_worker.progress")
IO = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class BeatCount:
    """What one beat sent: jobs whose count changed, UpdateItem requests, PublishBatch requests."""

    jobs: int = 0
    updates: int = 0
    publishes: int = 0


@dataclass
class _Tracked:
    job: Job
    reported: int = 0  # completion tokens last written


class ProgressReporter:
    """Tracks the jobs inside the engine and reports their progress every ``interval_s`` (0: never)."""

    def __init__(self, engine: Engine, store: JobStore, events: JobEvents | None, *, interval_s: float, io: IO) -> None:
        self.engine = engine
        self.store = store
        self.events = events
        self.interval_s = interval_s
        self._io = io
        self._jobs: dict[str, _Tracked] = {}

    def track(self, job: Job) -> None:
        """The job is in the engine now (its running state wrote ``progress`` at 0 tokens)."""
        self._jobs[job.job_id] = _Tracked(job)

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    async def run(self) -> None:
        """Beat every ``interval_s`` until cancelled; a failed beat is logged and the next one tries again."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat()
            except Exception:
                logger.exception("progress beat failed; the next one tries again")

    async def beat(self) -> BeatCount:
        now = utcnow()
        changed: list[tuple[_Tracked, JobProgress]] = []
        for tracked in list(self._jobs.values()):
            tokens = self.engine.tokens_so_far(tracked.job.job_id)
            if tokens is not None and tokens != tracked.reported:
                changed.append((tracked, JobProgress(completion_tokens=tokens, updated_at=now)))
        if not changed:
            return BeatCount()
        written = await asyncio.gather(
            *(self._io(self.store.record_progress, tracked.job.job_id, progress) for tracked, progress in changed),
            return_exceptions=True,
        )
        running = []
        for (tracked, progress), outcome in zip(changed, written):
            if isinstance(outcome, BaseException):
                logger.warning("job %s: progress not written (%s); the next beat tries again", tracked.job.job_id, outcome)
            elif outcome:  # False: no longer running (cancelled, or it ended between the read and the write)
                tracked.reported = progress.completion_tokens
                running.append((tracked, progress))
        publishes = 0
        if self.events is not None and running:
            activities = [
                JobActivity(event="job.progress", job_id=t.job.job_id, tenant=t.job.tenant, model=t.job.model,
                            started_at=t.job.started_at, progress=progress)
                for t, progress in running
            ]
            publishes = -(-len(activities) // 10)
            try:
                await self._io(self.events.publish_batch, activities)
            except Exception:
                logger.exception("%d progress events not published", len(activities))
        return BeatCount(jobs=len(changed), updates=len(changed), publishes=publishes)
