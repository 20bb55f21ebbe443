"""The pipeline end to end, over HTTP, against moto server: submit, claim check, worker, result, state, notification."""

from __future__ import annotations

import json
import time

import pytest
import requests

from async_inference import settings
from async_inference.aws import client
from async_inference.schemas import ChatCompletion, ClaimCheck, Job
from async_inference_client import ApiError, Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import Subscriber, chat

pytestmark = pytest.mark.e2e


def stored_job(stack: LocalDeployment, job_id: str) -> Job:
    assert stack.resources is not None
    table = client("dynamodb")
    item = table.get_item(
        TableName=stack.resources.config.table_name, Key={"job_id": {"S": job_id}}, ConsistentRead=True
    )
    from boto3.dynamodb.types import TypeDeserializer

    return Job.model_validate({k: TypeDeserializer().deserialize(v) for k, v in item["Item"].items()})


def result_objects(stack: LocalDeployment, tenant: str, job_id: str) -> list[dict]:
    """Every version of the job's result object: the bucket is versioned, as the template's is, so a second write of
    the result leaves a second version that this sees."""
    s3 = client("s3")
    key = settings.result_key(tenant, job_id)
    bucket = stack.resources.config.bucket_name
    versions = [v for v in s3.list_object_versions(Bucket=bucket, Prefix=key).get("Versions", []) if v["Key"] == key]
    return [
        json.loads(s3.get_object(Bucket=bucket, Key=key, VersionId=v["VersionId"])["Body"].read()) for v in versions
    ]


def test_inline_job_ends_with_result_in_s3_state_in_dynamodb_and_one_notification(
    stack, api, subscriber: Subscriber, worker
):
    # GIVEN a running worker
    # WHEN a client submits a chat request inline
    submitted = api.submit(chat("one two three four", max_tokens=3), metadata={"team": "search"})
    # THEN it gets a job id at once, queued
    assert submitted.status == "queued" and submitted.job_id.startswith("job_")

    final = api.wait(submitted.job_id, timeout_s=30)

    # THEN the job succeeded, with usage, and its result is an OpenAI chat.completion carrying the job id
    assert final.status == "succeeded", final
    assert final.usage.model_dump() == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    completion = ChatCompletion.model_validate(api.result(final))
    assert completion.job_id == submitted.job_id
    assert completion.choices[0].message.content == "one two three"
    assert completion.choices[0].finish_reason == "length"
    # AND the stored state agrees, with one attempt and timings
    job = stored_job(stack, submitted.job_id)
    assert job.status.value == "succeeded" and job.attempts == 1
    # (the notified mark follows the state write by up to the notification batch's delay)
    deadline = time.monotonic() + 5
    while not job.notified and time.monotonic() < deadline:
        time.sleep(0.1)
        job = stored_job(stack, submitted.job_id)
    assert job.notified
    assert job.created_at <= job.started_at <= job.finished_at
    # AND exactly one result object and one notification, with filterable attributes
    assert len(result_objects(stack, "tenant-a", submitted.job_id)) == 1
    notes = subscriber.for_job(submitted.job_id)
    assert [n["status"] for n in notes] == ["succeeded"]
    assert notes[0]["result_location"]["key"] == settings.result_key("tenant-a", submitted.job_id)
    assert notes[0]["metadata"] == {"team": "search"}
    assert subscriber.attributes[submitted.job_id][0] == {
        "status": "succeeded",
        "tenant": "tenant-a",
        "model": "echo-model",
        "webhook": "false",
        "event": "job.completed",
    }


def test_claim_check_on_the_queue_is_small_and_carries_no_prompt(stack, api):
    # GIVEN no worker, so the message stays on the queue
    prompt = "a secret prompt " * 500
    # WHEN a job is submitted
    submitted = api.submit(chat(prompt))
    # THEN the queued message is a claim check well under 1 KB that does not contain the prompt
    assert stack.resources is not None
    sqs = client("sqs")
    bodies = []
    for _ in range(5):
        messages = sqs.receive_message(
            QueueUrl=stack.resources.config.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=1
        ).get("Messages", [])
        bodies += [m["Body"] for m in messages]
        if any(submitted.job_id in b for b in bodies):
            break
    body = next(b for b in bodies if submitted.job_id in b)
    assert len(body.encode()) < 1024
    assert "secret" not in body
    claim = ClaimCheck.model_validate_json(body)
    assert claim.key == settings.request_key("tenant-a", submitted.job_id)
    api.cancel(submitted.job_id)  # leave nothing runnable behind for other tests


def test_upload_job_runs_after_the_presigned_put(api, worker):
    # GIVEN a request body too large to send inline is not needed: any body may take the upload path
    body = json.dumps(chat("uploaded body words", max_tokens=2)).encode()
    # WHEN the client creates an upload job and PUTs the body to the presigned URL
    created = api.submit_upload(body)
    # THEN the job was created awaiting its upload, with a presigned PUT that expires within 15 minutes
    assert created.status == "awaiting_upload"
    assert "X-Amz-Signature=" in created.upload.url and "X-Amz-Expires=900" in created.upload.url
    # AND once the upload lands the job runs to a result
    final = api.wait(created.job_id, timeout_s=30)
    assert final.status == "succeeded", final
    assert api.result(final).choices[0].message.content == "uploaded body"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"this is not json", "not valid JSON"),
        (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        (
            json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}).encode(),
            "max_tokens",
        ),
    ],
)
def test_bad_upload_fails_the_job_with_a_reason(api, subscriber: Subscriber, body, reason):
    # WHEN the uploaded object is not a valid request
    created = api.submit_upload(body)
    final = api.wait(created.job_id, timeout_s=30)
    # THEN the job is failed, and the reason says what was wrong; the failure is notified
    assert final.status == "failed"
    assert reason in final.error
    assert [n["status"] for n in subscriber.for_job(created.job_id)] == ["failed"]


def test_upload_of_another_size_than_announced_fails_and_is_deleted(stack, api):
    # GIVEN an upload job announced at 500 bytes
    response = requests.post(
        f"{stack.api_url}/v1/jobs",
        headers={"x-api-key": "tenant-a-key-0123456789"},
        json={"upload": {"size_bytes": 500}},
    )
    created = response.json()
    # WHEN the client PUTs a different number of bytes (moto does not enforce the signed Content-Length; S3 does)
    body = json.dumps(chat("short")).encode()
    requests.put(created["upload"]["url"], data=body, headers={"Content-Type": "application/json"})
    final = Client(stack.api_url, "tenant-a-key-0123456789").wait(created["job_id"], timeout_s=30)
    # THEN the job fails with the sizes in the reason, and the object is gone
    assert final.status == "failed"
    assert f"{len(body)} bytes but 500 were announced" in final.error
    listing = client("s3").list_objects_v2(
        Bucket=stack.resources.config.bucket_name, Prefix=settings.upload_key("tenant-a", created["job_id"])
    )
    assert listing.get("KeyCount", 0) == 0


def test_job_cancelled_before_a_worker_reaches_it_never_runs(stack, api, subscriber: Subscriber):
    # GIVEN a queued job and no worker
    submitted = api.submit(chat("never run me"))
    # WHEN the client cancels it, and only then a worker starts
    cancelled = api.cancel(submitted.job_id)
    assert cancelled.status == "cancelled"
    process = stack.start_worker()
    try:
        # A worker process starts in a second or two; a loaded CI machine can take far longer.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _queue_depth(stack) > 0:
            time.sleep(0.3)
        assert _queue_depth(stack) == 0, "the worker should have consumed the claim check"
    finally:
        process.terminate()
        process.wait(timeout=30)
    # THEN the job is still cancelled, never started, without a result, and notified once as cancelled
    job = stored_job(stack, submitted.job_id)
    assert job.status.value == "cancelled" and job.attempts == 0 and job.started_at is None
    assert result_objects(stack, "tenant-a", submitted.job_id) == []
    assert [n["status"] for n in subscriber.for_job(submitted.job_id)] == ["cancelled"]
    # AND cancelling again is a conflict
    with pytest.raises(ApiError) as conflict:
        api.cancel(submitted.job_id)
    assert conflict.value.status == 409


def _queue_depth(stack: LocalDeployment) -> int:
    assert stack.resources is not None
    attributes = client("sqs").get_queue_attributes(
        QueueUrl=stack.resources.config.queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_duplicate_delivery_of_one_message_produces_one_result_and_one_notification(stack, api, subscriber: Subscriber):
    # GIVEN a queued job whose claim check is delivered twice (SQS is at-least-once)
    submitted = api.submit(chat("say this once", max_tokens=3))
    job = stored_job(stack, submitted.job_id)
    assert stack.resources is not None
    client("sqs").send_message(
        QueueUrl=stack.resources.config.queue_url, MessageBody=job.claim_check().model_dump_json()
    )
    # WHEN two workers run at once (the copy that reaches the worker running the job reappears after its visibility
    # timeout: a short one, so that the test need not wait the deployed 60 s)
    short_visibility = {"VISIBILITY_TIMEOUT_S": "5", "HEARTBEAT_INTERVAL_S": "1"}
    workers = [stack.start_worker(**short_visibility), stack.start_worker(**short_visibility)]
    try:
        final = api.wait(submitted.job_id, timeout_s=30)
        # A worker process starts in a second or two; a loaded CI machine can take far longer.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _queue_depth(stack) > 0:
            time.sleep(0.3)
    finally:
        for process in workers:
            process.terminate()
        for process in workers:
            process.wait(timeout=30)
    # THEN one result object, one notification, and both messages consumed
    assert final.status == "succeeded"
    assert len(result_objects(stack, "tenant-a", submitted.job_id)) == 1
    assert [n["status"] for n in subscriber.for_job(submitted.job_id, wait_s=2)] == ["succeeded"]
    assert _queue_depth(stack) == 0


def test_dead_lettered_claim_check_fails_its_job_and_is_notified(stack, api, subscriber: Subscriber):
    # GIVEN a queued job whose claim check lands in the DLQ (as SQS does after the max receive count)
    submitted = api.submit(chat("poisoned"))
    api_job = stored_job(stack, submitted.job_id)
    assert stack.resources is not None and stack.resources.config.dlq_url
    client("sqs").send_message(
        QueueUrl=stack.resources.config.dlq_url, MessageBody=api_job.claim_check().model_dump_json()
    )
    # WHEN the DLQ handler sees it
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and api.get(submitted.job_id).status == "queued":
        time.sleep(0.3)
    # THEN the job is failed with the reason, and notified
    final = api.get(submitted.job_id)
    assert final.status == "failed"
    assert final.error == f"dead-lettered after {settings.MAX_RECEIVE_COUNT} attempts"
    assert [n["status"] for n in subscriber.for_job(submitted.job_id)] == ["failed"]


def test_queue_has_a_redrive_policy_to_the_dlq_with_the_shared_receive_count(stack):
    assert stack.resources is not None
    attributes = client("sqs").get_queue_attributes(QueueUrl=stack.resources.config.queue_url, AttributeNames=["All"])
    policy = json.loads(attributes["Attributes"]["RedrivePolicy"])
    assert int(policy["maxReceiveCount"]) == settings.MAX_RECEIVE_COUNT
    dlq = client("sqs").get_queue_attributes(QueueUrl=stack.resources.config.dlq_url, AttributeNames=["QueueArn"])
    assert policy["deadLetterTargetArn"] == dlq["Attributes"]["QueueArn"]
