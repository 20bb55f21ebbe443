"""Transient faults are retried by redelivery; one that never clears ends in the DLQ and the job failed."""

from __future__ import annotations

import pytest

from async_inference import settings
from tests.faults.fault_stack import FaultStack, Subscriber, chat, wait_until


@pytest.mark.parametrize(
    ("fault", "attempts"),
    [
        ("s3_get_fails=2", 1),  # S3 throttling on the payload read: it is read while the job is queued, so it ran once
        ("ddb_write_fails=2", 1),  # DynamoDB throttling on the move to running: it never got to run until then
        ("engine_oom=2", 3),  # the engine ran out of memory twice
    ],
)
def test_transient_fault_is_retried_by_redelivery_and_the_job_succeeds(
    workers: FaultStack, subscriber: Subscriber, fault, attempts
):
    # GIVEN a worker whose S3 adapter, DynamoDB adapter or engine fails the first two times for each job
    worker = workers.start_worker(f"transient-{fault}", WORKER_FAULTS=fault, TRANSIENT_RETRY_DELAY_S="1")
    # WHEN a job is submitted
    job_id = workers.api().submit(chat("try try again", max_tokens=2)).job_id
    job = workers.wait_final([job_id], timeout_s=30)[job_id]
    # THEN it succeeded on the third receive (after 1 s and 2 s of backoff), with one result and one notification
    assert job.status.value == "succeeded", job
    assert job.attempts == attempts
    assert len(workers.result_objects(job_id)) == 1
    wait_until(lambda: workers.queue_depth() == 0, 10, "the message to be deleted")
    assert [n["status"] for n in subscriber.drain()[job_id]] == ["succeeded"]
    assert "fails (2 of 2)" in worker.log_path.read_text()
    workers.stop_worker(worker)


def test_fault_that_never_clears_ends_in_the_dlq_and_the_job_failed(workers: FaultStack, subscriber: Subscriber):
    # GIVEN a worker whose S3 reads are always throttled, retrying at once
    worker = workers.start_worker("never-clears", WORKER_FAULTS="s3_get_fails=always", TRANSIENT_RETRY_DELAY_S="0")
    # WHEN a job is submitted
    job_id = workers.api().submit(chat("never going to work")).job_id
    job = workers.wait_final([job_id], timeout_s=30)[job_id]
    # THEN after the max receive count SQS moved it to the DLQ, whose handler failed the job and notified
    assert job.status.value == "failed"
    assert job.error == f"dead-lettered after {settings.MAX_RECEIVE_COUNT} attempts"
    assert job.attempts == 0  # attempts counts runs: its payload, read while it was queued, never could be
    assert workers.result_objects(job_id) == []
    assert [n["status"] for n in subscriber.drain()[job_id]] == ["failed"]
    # AND neither queue holds it any more (the DLQ handler consumed it)
    wait_until(
        lambda: workers.queue_depth() == 0 and workers.queue_depth(workers.config.dlq_url) == 0,
        10,
        "both queues to be empty",
    )
    workers.stop_worker(worker)
