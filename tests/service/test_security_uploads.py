"""One upload job, one claim check: a presigned PUT replayed while the URL is valid queues nothing more and cannot
change what the job runs; against a real moto server over HTTP (the PUTs go to its S3 through the presigned URL).

The upload function runs on each S3 "object created" event: here ``UploadIntake.accept_upload`` is called once per PUT,
as that event would call it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from async_inference import settings
from async_inference.aws import Blobs, JobStore, Notifier, client
from async_inference.config import ServiceConfig
from async_inference.fleets import ANY_MODEL, FleetRoute
from async_inference.jobs import JobStatus
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest, JobSubmission, UploadSpec
from local_runtime.moto_server import MotoServer, free_port

TENANT = "tenant-a"


def body(prompt: str) -> bytes:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": prompt}]).model_dump_json().encode()


ORIGINAL, SWAPPED = body("the request that was checked"), body("a request put in its place!!")
assert len(ORIGINAL) == len(SWAPPED)  # the same size: the announced size alone cannot tell them apart


@pytest.fixture(scope="module")
def tables(moto: MotoServer) -> ServiceConfig:
    client("s3").create_bucket(Bucket="claim-checks")
    client("dynamodb").create_table(
        TableName="jobs",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": settings.TABLE_PARTITION_KEY, "AttributeType": "S"}],
        KeySchema=[{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
    )
    return ServiceConfig(
        table_name="jobs",
        bucket_name="claim-checks",
        queue_url="",
        topic_arn=client("sns").create_topic(Name="results")["TopicArn"],
    )


@pytest.fixture
def service(tables: ServiceConfig) -> JobService:
    """The service over a job queue of the test's own, so the claim checks counted are this test's."""
    queue_url = client("sqs").create_queue(QueueName=f"jobs-{free_port()}")["QueueUrl"]
    return JobService(
        store=JobStore(tables.table_name),
        blobs=Blobs(tables.bucket_name),
        fleets={ANY_MODEL: FleetRoute(queue_url=queue_url)},
        notifier=Notifier(tables.topic_arn),
    )


def claim_checks(service: JobService) -> list[dict[str, Any]]:
    found = []
    while True:
        messages = (
            client("sqs")
            .receive_message(
                QueueUrl=service.queues.fleets[ANY_MODEL].queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=0,
                VisibilityTimeout=60,
            )
            .get("Messages", [])
        )
        if not messages:
            return found
        found += [json.loads(m["Body"]) for m in messages]


def put(upload: Any, data: bytes) -> None:
    response = requests.put(upload.url, data=data, headers=upload.headers, timeout=10)
    assert response.status_code == 200, response.text


def upload_job(service: JobService) -> Any:
    return service.api.submit(TENANT, JobSubmission(upload=UploadSpec(size_bytes=len(ORIGINAL))), None)


def test_a_replayed_upload_put_queues_nothing_and_changes_nothing(service):
    # GIVEN an upload job whose upload was PUT and accepted
    submitted = upload_job(service)
    put(submitted.upload, ORIGINAL)
    accepted = service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))
    assert accepted.status is JobStatus.QUEUED
    # WHEN the same presigned URL is PUT twice more while it is valid, once with the same bytes, once with others
    put(submitted.upload, ORIGINAL)
    again = service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))
    put(submitted.upload, SWAPPED)
    swapped = service.uploads.accept_upload(submitted.job.request_key, len(SWAPPED))
    # THEN one claim check was sent, for the request that was checked, and the replays left no object behind
    [claim] = claim_checks(service)
    assert claim["job_id"] == submitted.job.job_id and again.status is swapped.status is JobStatus.QUEUED
    assert claim["key"] == settings.request_key(TENANT, submitted.job.job_id) != submitted.job.request_key
    assert service.blobs.get(claim["key"], max_bytes=10_000) == ORIGINAL
    with pytest.raises(KeyError):
        service.blobs.get(submitted.job.request_key, max_bytes=10_000)


def test_two_events_for_one_awaited_upload_queue_it_once(service):
    # GIVEN an upload job awaiting its upload, PUT twice before either event is handled
    submitted = upload_job(service)
    put(submitted.upload, ORIGINAL)
    put(submitted.upload, ORIGINAL)
    # WHEN both events are handled
    first = service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))
    second = service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))
    # THEN the job is queued with one claim check
    assert first.status is second.status is JobStatus.QUEUED
    assert [c["job_id"] for c in claim_checks(service)] == [submitted.job.job_id]


def test_an_acceptance_interrupted_before_its_send_is_completed_by_the_events_redelivery(service, monkeypatch):
    # GIVEN an upload whose acceptance wrote `queued` and then ended before it sent the claim check
    submitted = upload_job(service)
    put(submitted.upload, ORIGINAL)
    with monkeypatch.context() as patch:

        def crash(job: Any) -> None:
            raise TimeoutError("the function timed out")

        patch.setattr(service.queues, "enqueue", crash)
        with pytest.raises(TimeoutError):
            service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))
    assert service.store.get(submitted.job.job_id).status is JobStatus.QUEUED and claim_checks(service) == []
    # WHEN Lambda redelivers the event once that invocation is surely over (the function's timeout: 0 s here)
    monkeypatch.setattr(settings, "UPLOAD_INTAKE_TIMEOUT_S", 0)
    service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))
    service.uploads.accept_upload(submitted.job.request_key, len(ORIGINAL))  # and a replayed PUT's event after it
    # THEN the claim check is sent, once
    assert [c["job_id"] for c in claim_checks(service)] == [submitted.job.job_id]
