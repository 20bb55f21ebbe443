"""What the world hears of a job the worker runs: that it started (its ``started`` webhook and its job.started event)
and how it ended (its result notification), each in batched requests.

A start is announced beside the job's generation: neither waits for the other, and neither can fail the job. An end
is announced once its final state is stored; whether the notification went out decides whether the job's message is
done with (a redelivery finds the job final and not notified, and sends it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from async_inference.aws import JobEvents, WebhookQueues
from async_inference.jobs_service import JobOutcomes, JobResult
from async_inference.schemas import Job, JobActivity
from async_inference.webhooks.events import EVENT_STARTED, started_event
from gpu_worker.batcher import Batcher

logger = logging.getLogger("gpu_worker.announce")
IO = Callable[..., Awaitable[Any]]
# How long a finished job's notification may wait for others to share a PublishBatch: notifications arrive up to this
# much later, for a tenth of the SNS and DynamoDB requests at load. job.started events wait as long.
NOTIFY_BATCH_DELAY_S = 0.1


class Announcer:
    """Announces the starts and ends of jobs: ``started`` (fire and forget), ``finished`` (published or not)."""

    def __init__(
        self, outcomes: JobOutcomes, *, webhooks: WebhookQueues | None, events: JobEvents | None, io: IO
    ) -> None:
        """``webhooks``: where started webhooks go (None: jobs that ask for one do not get it, logged); ``events``:
        the job event topic (None: no job.started events)."""
        self.outcomes = outcomes
        self._webhooks = webhooks
        self._events = events
        self._io = io
        self._pending: set[asyncio.Task[None]] = set()
        self._notices = Batcher(self._notify_batch, max_delay_s=NOTIFY_BATCH_DELAY_S)  # (job, result) -> published?
        self._activities = Batcher(self._publish_activities, max_delay_s=NOTIFY_BATCH_DELAY_S)

    def started(self, job: Job) -> None:
        """Send the job's started webhook (if it asked for one) and its job.started event, beside its generation."""
        task = asyncio.create_task(self._send_start(job))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def finished(self, job: Job, result: JobResult | None) -> bool:
        """Publish the final job's notification (batched with others); whether it went out."""
        return bool(await (await self._notices.add((job, result))))

    async def close(self) -> None:
        """Send what waits: the starts on their way, then the batched events and notifications."""
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self._activities.close()
        await self._notices.close()

    async def _send_start(self, job: Job) -> None:
        if job.webhook and EVENT_STARTED in job.webhook.events:
            if self._webhooks is None:
                logger.warning("job %s asked for a started webhook but no webhook queue is configured", job.job_id)
            else:  # never raises: a lost "started" must not cost the run
                await self._io(started_event, job, self._webhooks)
        if self._events is not None:
            await self._activities.add(
                JobActivity(
                    event="job.started",
                    job_id=job.job_id,
                    tenant=job.tenant,
                    model=job.model,
                    started_at=job.started_at,
                    progress=job.progress,
                )
            )

    async def _notify_batch(self, finished: list[tuple[Job, JobResult | None]]) -> list[bool]:
        return await self._io(self.outcomes.notify_many, finished)

    async def _publish_activities(self, activities: list[JobActivity]) -> list[bool]:
        assert self._events is not None
        try:
            return await self._io(self._events.publish_batch, activities)
        except Exception:
            logger.exception("%d job.started events not published", len(activities))
            return [False] * len(activities)
