"""One job, one execution (issue #16, finding 2): a worker that runs a job holds its lease, so a copy of its claim
check (a replayed upload PUT, a redelivery) received by a second worker does not start it again while it runs."""

from __future__ import annotations

import time

import pytest

from async_inference.aws import JobQueue, client
from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService
from local_runtime.worker_thread import WorkerThread
from tests.e2e.conftest import chat
from tests.e2e.test_worker_batching import Concurrency, RecordingQueue, worker_for

pytestmark = pytest.mark.e2e

FAST = dict(visibility_timeout_s=2, heartbeat_interval_s=0.5, transient_retry_delay_s=0)


def messages_on(queue_url: str) -> int:
    """Messages on the queue, visible or held by a consumer."""
    attributes = client("sqs").get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_a_copy_of_a_running_jobs_claim_check_does_not_start_it_on_a_second_worker(stack, api):
    queue_url = stack.resources.config.queue_url
    first_engine, second_engine = Concurrency(capacity=2, delay_s=6.0), Concurrency(capacity=2, delay_s=0.1)
    first = worker_for(first_engine, RecordingQueue(queue_url), **FAST)
    second = worker_for(second_engine, RecordingQueue(queue_url), **FAST)
    with WorkerThread(first) as running_first:
        # GIVEN a job that generates for 6 s on a first worker, whose messages reappear 2 s after its last heartbeat
        job = api.submit(chat("run me once"), timeout_seconds=8)
        deadline = time.monotonic() + 30
        while job.job_id not in first_engine.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.get(job.job_id).status == "running"
        # WHEN a copy of its claim check reaches the queue (as a replayed upload PUT sends one) and a second worker,
        # with the same short visibility, receives it while the first still runs the job
        claim = JobService.from_config(ServiceSettings.load().service).store.get(job.job_id).claim_check()
        JobQueue(queue_url).send(claim)
        with WorkerThread(second):
            while running_first.jobs_finished < 1 and time.monotonic() < deadline:
                assert api.get(job.job_id).attempts == 1, "the job was started a second time while it ran"
                time.sleep(0.1)
            # THEN the job ran once, on the first worker, and succeeded on its first attempt
            final = api.get(job.job_id)
            assert (final.status, final.attempts) == ("succeeded", 1)
            assert first_engine.seen == [job.job_id] and second_engine.seen == []
            # AND the copy, hidden while the job ran, comes back, finds the job final and is deleted
            while messages_on(queue_url) and time.monotonic() < deadline + 15:
                time.sleep(0.2)
            assert messages_on(queue_url) == 0
    assert second_engine.seen == []


def test_a_message_received_again_by_the_worker_that_holds_it_runs_its_job_once(stack, api):
    queue_url = stack.resources.config.queue_url
    engine, queue = Concurrency(capacity=2, delay_s=5.0), RecordingQueue(queue_url)
    # GIVEN a worker whose heartbeat (every 3 s) comes later than its messages' visibility (1 s) lapses, as a loaded
    # worker's can: the message of the job it runs becomes visible again and it receives that message itself
    worker = worker_for(engine, queue, visibility_timeout_s=1, heartbeat_interval_s=3, transient_retry_delay_s=0)
    with WorkerThread(worker) as running:
        job = api.submit(chat("run me once, here"), timeout_seconds=10)
        deadline = time.monotonic() + 40
        while running.jobs_finished < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        # WHEN the job has run
        final = api.get(job.job_id)
        # THEN the worker received its message more than once, yet started the job once, on its first attempt
        assert queue.bodies.count(queue.bodies[0]) >= 2, "the message was not received again: nothing was tested"
        assert engine.seen == [job.job_id]
        assert (final.status, final.attempts) == ("succeeded", 1)
        # AND the message is deleted with the newest receipt handle, so it does not come back
        while messages_on(queue_url) and time.monotonic() < deadline + 10:
            time.sleep(0.2)
        assert messages_on(queue_url) == 0
