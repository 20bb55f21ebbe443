"""Progress events only for jobs someone follows (issue 21, defect 6): each job.progress event invokes the push
function, so a worker publishes it only for jobs an open WebSocket connection subscribed to."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from async_inference.aws import ConnectionStore, JobEvents, JobStore
from async_inference.jobs import JobStatus
from async_inference.schemas import JobProgress, Subscription, utcnow
from gpu_worker.progress import ProgressReporter
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import chat
from tests.e2e.test_progress import Tokens, _io

pytestmark = pytest.mark.e2e


class RecordedEvents(JobEvents):
    """The deployed job event topic, remembering which jobs' events were published."""

    def __init__(self, topic_arn: str) -> None:
        super().__init__(topic_arn)
        self.published: list[str] = []

    def publish_batch(self, activities: list[Any]) -> None:
        super().publish_batch(activities)
        self.published.extend(a.job_id for a in activities)


def test_progress_is_published_only_for_jobs_a_connection_follows(stack: LocalDeployment, api, other_api):
    # GIVEN three running jobs of tenant-a, the deployed job event topic and connection table
    assert stack.resources is not None
    outputs = stack.resources.outputs
    store = JobStore(stack.resources.config.table_name)
    events = RecordedEvents(outputs["JobEventTopicArn"])
    connections = ConnectionStore(outputs["ConnectionTableName"])
    jobs = []
    for i in range(3):
        job_id = api.submit(chat(f"followed {i}")).job_id
        jobs.append(
            store.transition(
                job_id,
                JobStatus.RUNNING,
                started_at=utcnow(),
                progress=JobProgress(completion_tokens=0, updated_at=utcnow()),
            )
        )
    engine = Tokens()
    reporter = ProgressReporter(engine, store, events, interval_s=1, io=_io, followers=connections)
    for job in jobs:
        reporter.track(job)
    try:
        # AND a tenant-a connection that follows the first job, and a tenant-b connection that follows all of its own
        connections.open("conn-a", "tenant-a")
        connections.subscribe("conn-a", Subscription(action="subscribe", job_ids=[jobs[0].job_id]))
        connections.open("conn-b", "tenant-b")
        connections.subscribe("conn-b", Subscription(action="subscribe", all=True))
        # WHEN every job generated tokens and a beat runs
        engine.counts = {job.job_id: 5 for job in jobs}
        beat = asyncio.run(reporter.beat())
        # THEN every job's progress is written, one Query read tenant-a's followers, and only the followed job's
        # event was published (tenant-b's connection follows tenant-b's work, not tenant-a's)
        assert (beat.jobs, beat.updates, beat.queries, beat.publishes) == (3, 3, 1, 1)
        assert events.published == [jobs[0].job_id]
        assert [store.get(job.job_id).progress.completion_tokens for job in jobs] == [5, 5, 5]

        # WHEN a tenant-a connection subscribes to all of its tenant's work, and the jobs move on
        connections.open("conn-a-all", "tenant-a")
        connections.subscribe("conn-a-all", Subscription(action="subscribe", all=True))
        engine.counts = {job.job_id: 9 for job in jobs}
        asyncio.run(reporter.beat())
        # THEN every job's event is published
        assert sorted(events.published[1:]) == sorted(job.job_id for job in jobs)

        # WHEN nobody follows any more THEN progress is still written, and no event is published
        for connection in ("conn-a", "conn-a-all", "conn-b"):
            connections.close(connection)
        engine.counts = {job.job_id: 12 for job in jobs}
        quiet = asyncio.run(reporter.beat())
        assert (quiet.updates, quiet.publishes) == (3, 0) and len(events.published) == 4
    finally:
        for job in jobs:
            api.cancel(job.job_id)
