"""Upload jobs whose upload never arrives end `expired`, against a real moto server over HTTP.

The fixture creates only what these tests touch: the job table (with the tenant index), the claim-check bucket, the
job queue, the upload-deadline queue, and the result topic with one raw subscriber queue to see notifications.
Jobs keep the default ttl (24 h) while ``settings.PRESIGNED_UPLOAD_EXPIRY_S`` is shortened to a few seconds, as a
15-minute window is short beside a day's ttl; the grace is a constructor argument. So nothing waits 15 minutes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import time
from typing import Any

import pytest

from async_inference import settings
from async_inference.aws import Blobs, JobStore, Notifier, UploadDeadlines, client
from async_inference.config import ServiceConfig
from async_inference.fleets import ANY_MODEL, FleetRoute
from async_inference.jobs import JobStatus
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest, JobSubmission, UploadSpec, utcnow
from local_runtime.lambda_host import Context
from local_runtime.moto_server import MotoServer, free_port
from local_runtime.pollers import sqs_event

TENANT = "tenant-a"
BODY = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]).model_dump_json().encode()


@pytest.fixture(scope="module")
def config(moto: MotoServer) -> ServiceConfig:
    sqs, sns, dynamodb = client("sqs"), client("sns"), client("dynamodb")
    client("s3").create_bucket(Bucket="claim-checks")
    dynamodb.create_table(
        TableName="jobs",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": "S"}
            for name in (
                settings.TABLE_PARTITION_KEY,
                settings.TENANT_INDEX_PARTITION_KEY,
                settings.TENANT_INDEX_SORT_KEY,
            )
        ],
        KeySchema=[{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": settings.TENANT_INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": settings.TENANT_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": settings.TENANT_INDEX_SORT_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    return ServiceConfig(
        table_name="jobs",
        bucket_name="claim-checks",
        queue_url=sqs.create_queue(QueueName="jobs")["QueueUrl"],
        topic_arn=sns.create_topic(Name="results")["TopicArn"],
        upload_deadlines_queue_url=sqs.create_queue(QueueName="upload-deadlines")["QueueUrl"],
    )


@pytest.fixture(scope="module")
def notifications(config: ServiceConfig) -> str:
    """A queue subscribed (raw) to the result topic: what a subscriber of the service receives."""
    sqs = client("sqs")
    url = sqs.create_queue(QueueName="subscriber")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    client("sns").subscribe(
        TopicArn=config.topic_arn, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
    )
    return url


def _service(config: ServiceConfig, *, grace_s: int = 0) -> JobService:
    return JobService(
        store=JobStore(config.table_name),
        blobs=Blobs(config.bucket_name),
        fleets={ANY_MODEL: FleetRoute(queue_url=config.queue_url)},
        notifier=Notifier(config.topic_arn),
        deadlines=UploadDeadlines(config.upload_deadlines_queue_url),
        upload_grace_s=grace_s,
    )


@pytest.fixture
def isolated(config: ServiceConfig, request: pytest.FixtureRequest) -> ServiceConfig:
    """``config`` with an upload-deadline queue of the test's own, so no other test's deadline shows up in it."""
    name = f"deadlines-{request.node.name[:40].replace('_', '-')}-{free_port()}"
    url = client("sqs").create_queue(QueueName=name)["QueueUrl"]
    return dataclasses.replace(config, upload_deadlines_queue_url=url)


def _receive(url: str, wait_s: int = 0) -> list[dict[str, Any]]:
    return (
        client("sqs")
        .receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s, MessageSystemAttributeNames=["All"]
        )
        .get("Messages", [])
    )


def _receive_for(url: str, job_id: str, wait_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for message in _receive(url, wait_s=1):
            if json.loads(message["Body"])["job_id"] == job_id:
                return message
    return None


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch):
    """``window(seconds)``: the presign window of the jobs created next (their ttl stays the default 24 h)."""
    return lambda seconds: monkeypatch.setattr(settings, "PRESIGNED_UPLOAD_EXPIRY_S", seconds)


def _upload_job(service: JobService, idempotency_key: str | None = None):
    return service.api.submit(TENANT, JobSubmission(upload=UploadSpec(size_bytes=len(BODY))), idempotency_key)


def test_creating_an_upload_job_schedules_its_deadline_at_the_window_end(isolated, window):
    """GIVEN an upload job with a 2 s presign window WHEN it is created THEN its deadline is on the queue, hidden until the
    window ends."""
    deadline_queue = isolated.upload_deadlines_queue_url
    window(2)
    job = _upload_job(_service(isolated)).job
    assert _receive(deadline_queue) == []
    message = _receive_for(deadline_queue, job.job_id, wait_s=6)
    assert message is not None and json.loads(message["Body"]) == {"schema_version": "1", "job_id": job.job_id}


def test_an_inline_job_schedules_no_deadline(isolated, window):
    """GIVEN an inline job WHEN it is created THEN no upload deadline is sent (it has no upload to wait for)."""
    window(1)
    submission = JobSubmission(request=ChatCompletionRequest.model_validate_json(BODY))
    _service(isolated).api.submit(TENANT, submission, None)
    time.sleep(1.1)
    assert _receive(isolated.upload_deadlines_queue_url, wait_s=1) == []


def test_a_job_past_its_window_and_grace_expires_with_a_reason_and_a_ttl(config, notifications, window):
    """GIVEN an upload job (24 h ttl) whose 1 s presign window and grace are over WHEN its deadline is checked THEN it
    is expired with the reason, its record TTL is set, and subscribers are notified."""
    service = _service(config)
    window(1)
    job = _upload_job(service).job
    time.sleep(1.2)
    check = service.deadlines.check(json.dumps({"schema_version": "1", "job_id": job.job_id}))
    assert check.retry_in_s == 0
    assert check.job is not None and check.job.status is JobStatus.EXPIRED
    assert check.job.error == "the upload did not arrive within its 1-second presign window"
    item = client("dynamodb").get_item(
        TableName=config.table_name, Key={settings.TABLE_PARTITION_KEY: {"S": job.job_id}}
    )["Item"]
    assert int(item[settings.TABLE_TTL_ATTRIBUTE]["N"]) > time.time() + (settings.JOB_RECORD_RETENTION_DAYS - 1) * 86400
    notices = [json.loads(m["Body"]) for m in _receive(notifications, wait_s=1)]
    assert {"job_id": job.job_id, "status": "expired"}.items() <= next(
        n for n in notices if n["job_id"] == job.job_id
    ).items()


def test_a_deadline_that_comes_before_the_grace_is_over_asks_to_look_again(config, window):
    """GIVEN an upload job whose window is over but not its 60 s grace WHEN its deadline is checked THEN the job still
    awaits its upload and the check says to look again when the grace is over."""
    service = _service(config, grace_s=60)
    window(1)
    job = _upload_job(service).job
    time.sleep(1.1)
    check = service.deadlines.check(json.dumps({"schema_version": "1", "job_id": job.job_id}))
    assert 55 <= check.retry_in_s <= 60
    assert service.store.get(job.job_id).status is JobStatus.AWAITING_UPLOAD


def test_a_job_whose_upload_arrived_is_left_queued(config, window):
    """GIVEN an upload job whose upload was accepted WHEN its deadline comes after the window THEN it stays queued."""
    service = _service(config)
    window(1)
    job = _upload_job(service).job
    service.blobs.put_json(job.request_key, BODY)
    assert service.uploads.accept_upload(job.request_key, len(BODY)).status is JobStatus.QUEUED
    time.sleep(1.1)
    check = service.deadlines.check(json.dumps({"schema_version": "1", "job_id": job.job_id}))
    assert check.retry_in_s == 0 and check.job.status is JobStatus.QUEUED


def test_an_expiry_from_a_stale_read_cannot_expire_a_queued_job(config):
    """GIVEN a job read while awaiting its upload, then queued by its upload WHEN the upload expiry is written from
    the stale read THEN the conditional write refuses it (only awaiting_upload may expire this way)."""
    service = _service(config)
    stale = _upload_job(service).job
    service.blobs.put_json(stale.request_key, BODY)
    service.uploads.accept_upload(stale.request_key, len(BODY))
    moved = service.store.transition(stale.job_id, JobStatus.EXPIRED, only_from={JobStatus.AWAITING_UPLOAD})
    assert moved is None and service.store.get(stale.job_id).status is JobStatus.QUEUED


def test_a_get_after_the_window_and_grace_expires_the_job(config, window):
    """GIVEN an upload job (24 h ttl) past its presign window and grace WHEN the client GETs it THEN it is expired with
    the reason, not a day later at its ttl."""
    service = _service(config)
    window(1)
    job = _upload_job(service).job
    time.sleep(1.1)
    got = service.api.get(TENANT, job.job_id)
    assert got.status is JobStatus.EXPIRED and "1-second presign window" in got.error


def test_an_idempotent_retry_never_extends_the_upload_window(config, window):
    """GIVEN an upload job WHEN the client retries its POST with the same Idempotency-Key THEN the new presigned URL
    expires when the first window does, not a full window later."""
    service = _service(config)
    window(5)
    first = _upload_job(service, idempotency_key=f"key-{time.time()}")
    time.sleep(2)
    again = _upload_job(service, idempotency_key=first.job.idempotency_key)
    assert not again.created and again.upload is not None
    assert again.upload.expires_at <= first.job.upload_window_ends_at + dt.timedelta(seconds=1)


def test_the_handler_hides_an_early_deadline_and_reports_it_failed(isolated, monkeypatch, window):
    """GIVEN the deployed handler and a deadline received before its 3 s grace is over WHEN it runs THEN it reports
    that record as a batch item failure and SQS delivers it again only once the grace is over."""
    config, deadline_queue = isolated, isolated.upload_deadlines_queue_url
    for name, value in config.to_env().items():
        monkeypatch.setenv(name, value)
    handler = importlib.import_module("lambdas.upload_deadlines.handler")
    monkeypatch.setattr(handler.watch, "upload_grace_s", 3)
    window(1)
    job = _upload_job(_service(config)).job
    message = _receive_for(deadline_queue, job.job_id, wait_s=5)
    assert message is not None
    arn = client("sqs").get_queue_attributes(QueueUrl=deadline_queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    response = handler.lambda_handler(sqs_event([message], arn), Context(timeout_s=30))
    assert response == {"batchItemFailures": [{"itemIdentifier": message["MessageId"]}]}
    assert _receive(deadline_queue) == []  # hidden for the rest of the grace
    again = _receive_for(deadline_queue, job.job_id, wait_s=6)
    assert again is not None
    response = handler.lambda_handler(sqs_event([again], arn), Context(timeout_s=30))
    assert response == {"batchItemFailures": []}
    assert JobStore(config.table_name).get(job.job_id).status is JobStatus.EXPIRED
    assert utcnow() >= job.upload_window_ends_at
