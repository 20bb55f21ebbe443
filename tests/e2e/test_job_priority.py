"""Jobs submitted with ``priority: "batch"`` end to end: the API (deployed from the template) queues the claim check on
the batch-lane queue, a worker runs it in its batch lane, and an interactive job still goes first."""

from __future__ import annotations

import time

import pytest
import requests

from async_inference.aws import client
from async_inference.schemas import ClaimCheck
from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))


def _find_claim(queue_url: str, job_id: str, timeout_s: float = 15.0) -> ClaimCheck | None:
    """The job's claim check if it is on ``queue_url``; every message looked at is made visible again at once."""
    sqs = client("sqs")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        messages = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
        ).get("Messages", [])
        found = None
        for message in messages:
            if f'"job_id":"{job_id}"' in message["Body"]:
                found = ClaimCheck.model_validate_json(message["Body"])
            sqs.change_message_visibility(
                QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
        if found is not None:
            return found
    return None


def test_a_batch_priority_job_is_queued_on_the_batch_lane_and_runs_to_success(stack: LocalDeployment, api: Client):
    # GIVEN no worker running WHEN a job is submitted with priority "batch"
    job = api.submit(chat("lane of its own", max_tokens=4), priority="batch")
    assert (job.status.value, job.priority) == ("queued", "batch")
    # THEN its claim check is on the batch-lane queue, and not on the job queue
    assert stack.resources is not None
    claim = _find_claim(stack.resources.batch_queue_url, job.job_id)
    assert claim is not None and claim.job_id == job.job_id
    assert _find_claim(stack.resources.config.queue_url, job.job_id, timeout_s=2) is None
    # WHEN a worker runs
    worker = stack.start_worker()
    try:
        final = api.wait(job.job_id, timeout_s=60)
    finally:
        stack.stop_worker(worker)
    # THEN the job succeeded as any job does: its view, its result
    assert final.status.value == "succeeded" and final.priority == "batch"
    assert final.started_at is not None and final.usage is not None and final.attempts == 1
    assert api.result(final).choices[0].message.content == "lane of its own"


def test_an_interactive_job_behind_a_busy_batch_lane_finishes_before_the_batch_jobs(
    stack: LocalDeployment, api: Client
):
    # GIVEN two batch-priority jobs of 4 s each queued before one interactive job, and a worker with one engine slot
    # and no reserve: whichever lane it receives from first, the batch lane can only have the slot until the
    # interactive job asks for it
    delay_s = 4.0
    batch_jobs = [api.submit(chat(f"batch {i}", max_tokens=4), priority="batch").job_id for i in range(2)]
    interactive = api.submit(chat("interactive", max_tokens=4)).job_id
    worker = stack.start_worker(MAX_NUM_SEQS="1", INTERACTIVE_RESERVE="0", ECHO_DELAY_S=str(delay_s))
    try:
        jobs = {job_id: api.wait(job_id, timeout_s=120) for job_id in [interactive, *batch_jobs]}
    finally:
        stack.stop_worker(worker)
    # THEN every job succeeded, and the interactive one finished first, in about one generation: it waited behind no
    # batch job (one may have been preempted for it and run again)
    assert {j.status.value for j in jobs.values()} == {"succeeded"}
    first = jobs[interactive]
    assert first.finished_at is not None and first.started_at is not None
    assert all(first.finished_at < jobs[b].finished_at for b in batch_jobs)
    assert (first.finished_at - first.started_at).total_seconds() < 2 * delay_s


def test_an_unknown_priority_is_a_400_naming_the_field(stack: LocalDeployment):
    body = {"request": chat(), "priority": "urgent"}
    response = requests.post(f"{stack.api_url}/v1/jobs", json=body, headers={"x-api-key": KEY_A})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith("priority")
