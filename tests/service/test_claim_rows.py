"""A claim check carries the engine rows of its request (its ``n``), so that a worker's tenant share counts rows before
it reads the payload (gpu_worker.fairness); against a real moto server over HTTP, inline and uploaded."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from async_inference import settings
from async_inference.aws import Blobs, JobQueue, JobStore, Notifier, client
from async_inference.config import ServiceConfig
from async_inference.fleets import FleetRoute
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest, JobSubmission, UploadSpec
from local_runtime.moto_server import MotoServer, free_port

TENANT = "tenant-a"


def request(n: int) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], n=n, max_tokens=8)


@pytest.fixture(scope="module")
def service(moto: MotoServer) -> JobService:
    client("s3").create_bucket(Bucket="claim-checks")
    client("dynamodb").create_table(
        TableName="jobs",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": settings.TABLE_PARTITION_KEY, "AttributeType": "S"}],
        KeySchema=[{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
    )
    config = ServiceConfig(
        table_name="jobs",
        bucket_name="claim-checks",
        queue_url=client("sqs").create_queue(QueueName=f"jobs-{free_port()}")["QueueUrl"],
        topic_arn=client("sns").create_topic(Name="results")["TopicArn"],
    )
    return JobService(
        store=JobStore(config.table_name),
        blobs=Blobs(config.bucket_name),
        queue=JobQueue(config.queue_url),
        notifier=Notifier(config.topic_arn),
        fleets={"m": FleetRoute(queue_url=config.queue_url)},  # a model's route is the only way to its queue
    )


def next_claim_check(service: JobService) -> dict[str, Any]:
    [message] = client("sqs").receive_message(QueueUrl=service.queue.url, MaxNumberOfMessages=10, WaitTimeSeconds=0)[
        "Messages"
    ]
    client("sqs").delete_message(QueueUrl=service.queue.url, ReceiptHandle=message["ReceiptHandle"])
    return json.loads(message["Body"])


def test_an_inline_request_with_n_choices_is_queued_as_n_rows(service: JobService):
    # GIVEN a chat request asking for 8 choices WHEN it is submitted inline
    submitted = service.api.submit(TENANT, JobSubmission(request=request(8)), None)
    # THEN its claim check says it takes 8 engine rows
    claim = next_claim_check(service)
    assert (claim["job_id"], claim["rows"]) == (submitted.job.job_id, 8)


def test_an_uploaded_request_with_n_choices_is_queued_as_n_rows(service: JobService):
    # GIVEN an upload job, whose request is not known at submission, and its uploaded request of 5 choices
    body = request(5).model_dump_json().encode()
    submitted = service.api.submit(TENANT, JobSubmission(upload=UploadSpec(size_bytes=len(body))), None)
    assert submitted.upload is not None
    response = requests.put(submitted.upload.url, data=body, headers=submitted.upload.headers, timeout=10)
    assert response.status_code == 200, response.text
    # WHEN the upload is accepted
    service.uploads.accept_upload(submitted.job.request_key, len(body))
    # THEN its claim check says it takes 5 engine rows
    claim = next_claim_check(service)
    assert (claim["job_id"], claim["rows"]) == (submitted.job.job_id, 5)
