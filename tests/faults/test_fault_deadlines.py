"""Deadlines and cancels: expired and cancelled jobs never reach the engine; a cancel or a timeout aborts a run."""

from __future__ import annotations

import time

from tests.faults.fault_stack import FaultStack, Subscriber, chat, wait_until


def test_expired_and_cancelled_jobs_never_reach_the_engine(workers: FaultStack, subscriber: Subscriber):
    # GIVEN a job with a 1 s queue deadline and a job cancelled while queued, and no worker for 1.5 s
    api = workers.api()
    expiring = api.submit(chat("too late"), ttl_seconds=1).job_id
    cancelled = api.submit(chat("never mind")).job_id
    assert api.cancel(cancelled).status == "cancelled"
    time.sleep(1.5)
    # WHEN a worker receives both
    worker = workers.start_worker("expiry")
    wait_until(lambda: workers.queue_depth() == 0, 20, "the claim checks to be consumed")
    # THEN the first is expired and the second still cancelled; neither was ever moved to running (the only way to
    # the engine), neither has a result, each was notified once
    expired_job, cancelled_job = workers.job(expiring), workers.job(cancelled)
    assert expired_job.status.value == "expired" and expired_job.error == "still queued at its deadline"
    assert cancelled_job.status.value == "cancelled"
    for job in (expired_job, cancelled_job):
        assert job.attempts == 0 and job.started_at is None
        assert workers.result_objects(job.job_id) == []
    notes = subscriber.drain()
    assert [n["status"] for n in notes[expiring]] == ["expired"]
    assert [n["status"] for n in notes[cancelled]] == ["cancelled"]
    workers.stop_worker(worker)


def test_cancel_during_a_run_aborts_the_generation_and_a_timeout_fails_the_job(
    workers: FaultStack, subscriber: Subscriber
):
    # GIVEN a worker whose generations take 20 s, a job that may run that long and one with a 1 s execution timeout
    api = workers.api()
    worker = workers.start_worker("slow", ECHO_DELAY_S="20")
    to_cancel = api.submit(chat("cancel me while I run")).job_id
    timed = api.submit(chat("I will run too long"), timeout_seconds=1).job_id
    wait_until(lambda: workers.job(to_cancel).status.value == "running", 20, "the job to run")
    # WHEN the client cancels the running job
    started = time.monotonic()
    assert api.cancel(to_cancel).status == "cancelled"
    # THEN the engine is aborted within a heartbeat or two: the message is gone long before the 20 s generation ends
    wait_until(lambda: workers.queue_depth() == 0, 8, "both messages to be finished with")
    assert time.monotonic() - started < 8
    cancelled, timed_out = workers.job(to_cancel), workers.job(timed)
    assert cancelled.status.value == "cancelled" and workers.result_objects(to_cancel) == []
    # AND the job over its execution timeout failed with the reason
    assert timed_out.status.value == "failed" and timed_out.error == "execution timed out after 1 s"
    notes = subscriber.drain()
    assert [n["status"] for n in notes[to_cancel]] == ["cancelled"]
    assert [n["status"] for n in notes[timed]] == ["failed"]
    workers.stop_worker(worker)
