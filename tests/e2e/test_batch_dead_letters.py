"""A batch whose chunk exhausted its receives on the batch lane still finalizes: the template's DLQ handler consumes the
lane's DLQ, turns the chunk's lines into error lines and counts it (official ``openai`` SDK, local stack, no worker)."""

from __future__ import annotations

import json
import time

import openai
import pytest

from async_inference.aws import client
from async_inference.batches.dead_letters import DEAD_LETTERED_CODE
from async_inference.jobs import JobStatus
from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat
from tests.e2e.test_batches_openai import jsonl, line, settled, until, upload

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


def _lane_dlq_url(stack: LocalDeployment) -> str:
    """The batch lane's DLQ, as the lane's redrive policy (from the template) names it."""
    assert stack.resources is not None
    sqs = client("sqs")
    attributes = sqs.get_queue_attributes(QueueUrl=stack.resources.batch_queue_url, AttributeNames=["RedrivePolicy"])
    arn = json.loads(attributes["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"]
    return sqs.get_queue_url(QueueName=arn.rsplit(":", 1)[1])["QueueUrl"]


def _dead_letter(stack: LocalDeployment, marker: str, count: int, timeout_s: float = 20.0) -> list[str]:
    """Move ``count`` lane messages whose body holds ``marker`` to the lane's DLQ, as the redrive policy moves a
    message after its last receive (the same body); every other message looked at is made visible again."""
    assert stack.resources is not None
    sqs, lane, dlq = client("sqs"), stack.resources.batch_queue_url, _lane_dlq_url(stack)
    moved: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(moved) < count and time.monotonic() < deadline:
        for message in sqs.receive_message(
            QueueUrl=lane, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
        ).get("Messages", []):
            if marker in message["Body"]:
                sqs.send_message(QueueUrl=dlq, MessageBody=message["Body"])
                sqs.delete_message(QueueUrl=lane, ReceiptHandle=message["ReceiptHandle"])
                moved.append(message["Body"])
            else:
                sqs.change_message_visibility(
                    QueueUrl=lane, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
    assert len(moved) == count, f"found {len(moved)} of {count} lane messages with {marker}"
    return moved


def test_a_dead_lettered_chunk_becomes_error_lines_and_its_batch_completes(stack: LocalDeployment, sdk: openai.OpenAI):
    # GIVEN a batch of three lines (one chunk), planned and in progress, no worker running
    source = upload(sdk, jsonl([line("a"), line("b"), line("c")]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    settled(sdk, batch.id, "in_progress")
    # WHEN its chunk claim check exhausts its receives and moves to the lane's DLQ
    [chunk] = _dead_letter(stack, f'"batch_id":"{batch.id}"', 1)
    assert json.loads(chunk)["kind"] == "batch_chunk"
    # THEN the DLQ handler counts the chunk and the batch finalizes: completed, every line failed, an error file
    # whose lines name each custom_id with the dead-letter code, no output file
    done = settled(sdk, batch.id, "completed", "failed", "expired", "cancelled", timeout_s=60)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (3, 0, 3)
    assert done.output_file_id is None and done.error_file_id is not None
    errors = [json.loads(row) for row in sdk.files.content(done.error_file_id).content.splitlines()]
    assert sorted(e["custom_id"] for e in errors) == ["a", "b", "c"]
    assert {e["error"]["code"] for e in errors} == {DEAD_LETTERED_CODE}
    assert all(e["id"].startswith("batch_req_") and e["response"] is None for e in errors)


def test_a_dead_lettered_batch_priority_job_fails_with_the_dead_letter_reason(stack: LocalDeployment, api: Client):
    # GIVEN a job with priority "batch", queued on the lane, no worker running
    job = api.submit(chat("never runs", max_tokens=4), priority="batch")
    # WHEN its claim check exhausts its receives on the lane
    _dead_letter(stack, f'"job_id":"{job.job_id}"', 1)
    # THEN the DLQ handler fails the job with the reason, as it does for the job queue's DLQ
    failed = until(lambda: (j := api.get(job.job_id)).status is JobStatus.FAILED and j, timeout_s=30)
    assert failed, f"job {job.job_id} is {api.get(job.job_id).status}"
    assert "dead-lettered" in (failed.error or "")
