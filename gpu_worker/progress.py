"""Running jobs' progress: their tokens so far, written to each job and published as job.progress, at a bounded rate.

Every ``interval_s`` (``PROGRESS_INTERVAL_S``, 5 s) a beat asks the engine how many tokens each job inside it has
generated (``Engine.tokens_so_far``) and, for the jobs whose count changed since their last beat, makes

* one UpdateItem per job (``JobStore.record_progress``: ``SET progress``, conditional on the job still running), all of
  them at once on the worker's I/O pool, and
* one PublishBatch per ten jobs on the job event topic (``job.progress``), when the worker has that topic, for the
  jobs someone follows: with the connection table (``followers``), one Query per tenant of the changed jobs finds which
  of them an open WebSocket connection subscribed to (by id, or to all of the tenant's work), and only those are
  published. Each published event invokes the push function: at full load, publishing every job's progress would be
  about 27 invocations a second whether or not anyone listens, out of a new account's small Lambda concurrency.

So a beat with N changed jobs of T tenants costs N UpdateItems, T Queries and ceil(F/10) PublishBatch requests for
the F followed ones (N is at most the engine's capacity), and a job that generated nothing since the last beat costs
nothing. DynamoDB has no batched update:
BatchWriteItem replaces whole items and cannot be conditional, and PartiQL's BatchExecuteStatement (25 updates a
request) would cut requests but not cost, since DynamoDB bills write units (one per KB of item written), not requests.
``BeatCount`` says what each beat sent; ``tests/worker/test_progress.py`` measures it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from async_inference.aws import ConnectionStore, JobEvents, JobStore
from async_inference.schemas import Job, JobActivity, JobProgress, utcnow
from gpu_worker.engines.base import Engine

logger = logging.getLogger("gpu_worker.progress")
IO = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class BeatCount:
    """What one beat sent: jobs whose count changed, UpdateItem requests, PublishBatch requests, follower Queries."""

    jobs: int = 0
    updates: int = 0
    publishes: int = 0
    queries: int = 0


@dataclass
class _Tracked:
    job: Job
    reported: int = 0  # completion tokens last written


class ProgressReporter:
    """Tracks the jobs inside the engine and reports their progress every ``interval_s`` (0: never); ``followers``
    (the connection table) narrows the published events to followed jobs (None: every running job's is published)."""

    def __init__(
        self,
        engine: Engine,
        store: JobStore,
        events: JobEvents | None,
        *,
        interval_s: float,
        io: IO,
        followers: ConnectionStore | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.events = events
        self.followers = followers
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
        for (tracked, progress), outcome in zip(changed, written, strict=False):
            if isinstance(outcome, BaseException):
                logger.warning(
                    "job %s: progress not written (%s); the next beat tries again", tracked.job.job_id, outcome
                )
            elif outcome:  # False: no longer running (cancelled, or it ended between the read and the write)
                tracked.reported = progress.completion_tokens
                running.append((tracked, progress))
        publishes = queries = 0
        if self.events is not None and running and self.followers is not None:
            running, queries = await self._followed(running)
        if self.events is not None and running:
            activities = [
                JobActivity(
                    event="job.progress",
                    job_id=t.job.job_id,
                    tenant=t.job.tenant,
                    model=t.job.model,
                    started_at=t.job.started_at,
                    progress=progress,
                )
                for t, progress in running
            ]
            publishes = -(-len(activities) // 10)
            try:
                await self._io(self.events.publish_batch, activities)
            except Exception:
                logger.exception("%d progress events not published", len(activities))
        return BeatCount(jobs=len(changed), updates=len(changed), publishes=publishes, queries=queries)

    async def _followed(
        self, running: list[tuple[_Tracked, JobProgress]]
    ) -> tuple[list[tuple[_Tracked, JobProgress]], int]:
        """The entries of ``running`` whose job an open connection follows, and the Queries that took (one a tenant).
        A failed Query publishes nothing for its tenant: the progress is on the job, and the next beat asks again."""
        assert self.followers is not None
        by_tenant: dict[str, list[str]] = {}
        for tracked, _ in running:
            by_tenant.setdefault(tracked.job.tenant, []).append(tracked.job.job_id)
        answers = await asyncio.gather(
            *(self._io(self.followers.followed, tenant, ids) for tenant, ids in by_tenant.items()),
            return_exceptions=True,
        )
        followed: set[str] = set()
        for tenant, answer in zip(by_tenant, answers, strict=False):
            if isinstance(answer, BaseException):
                logger.warning(
                    "tenant %s: followers not read (%s); its progress events wait for the next beat", tenant, answer
                )
            else:
                followed |= answer
        return [(t, p) for t, p in running if t.job.job_id in followed], len(by_tenant)
