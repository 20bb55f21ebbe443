"""Idempotency-Key semantics of JobApi.submit against a real moto server over HTTP: the key is bound to the first
request's fingerprint; a request "in progress" (its body stored, its job not yet created) holds the key only for as
long as a request can run.

The fixture creates only what submit touches: the job table, the claim-check bucket, the job queue and the topic.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from async_inference import settings
from async_inference.aws import Blobs, JobStore, Notifier, client
from async_inference.config import ServiceConfig
from async_inference.fleets import ANY_MODEL, FleetRoute
from async_inference.jobs import new_job_id
from async_inference.jobs_service import ErrorKind, JobApi, JobService, ServiceError
from async_inference.schemas import ChatCompletionRequest, JobSubmission
from local_runtime.moto_server import LOCAL_CREDENTIALS, MotoServer, free_port

TENANT = "tenant-a"


def submission(prompt: str) -> JobSubmission:
    return JobSubmission(request=ChatCompletionRequest(model="m", messages=[{"role": "user", "content": prompt}]))


@pytest.fixture(scope="module")
def config() -> Iterator[ServiceConfig]:
    server = MotoServer(free_port()).start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in LOCAL_CREDENTIALS.items():
            patch.setenv(name, value)
        patch.setenv("AWS_ENDPOINT_URL", server.url)
        client("s3").create_bucket(Bucket="claim-checks")
        client("dynamodb").create_table(
            TableName="jobs",
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": settings.TABLE_PARTITION_KEY, "AttributeType": "S"}],
            KeySchema=[{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
        )
        yield ServiceConfig(
            table_name="jobs",
            bucket_name="claim-checks",
            queue_url=client("sqs").create_queue(QueueName="jobs")["QueueUrl"],
            topic_arn=client("sns").create_topic(Name="results")["TopicArn"],
        )
    server.stop()


def service(config: ServiceConfig, *, in_progress_s: int = settings.IDEMPOTENCY_IN_PROGRESS_S) -> JobApi:
    return JobService(
        store=JobStore(config.table_name),
        blobs=Blobs(config.bucket_name),
        fleets={ANY_MODEL: FleetRoute(queue_url=config.queue_url)},
        notifier=Notifier(config.topic_arn),
        idempotency_in_progress_s=in_progress_s,
    ).api


def leave_a_body_without_a_job(config: ServiceConfig, key: str, prompt: str) -> str:
    """What a request with ``key`` leaves when it stored its body and then ended (or has not yet gone on)."""
    request_key = settings.request_key(TENANT, new_job_id(TENANT, key))
    body = submission(prompt).request.model_dump_json(exclude_none=True).encode()  # type: ignore[union-attr]
    client("s3").put_object(Bucket=config.bucket_name, Key=request_key, Body=body)
    return request_key


def test_the_same_request_again_gets_the_same_job_whatever_its_key_order_or_omitted_defaults(config):
    # GIVEN a job made with an Idempotency-Key
    first = service(config).submit(TENANT, submission("same"), "same-request")
    # WHEN the same request comes again, spelled with its defaults written out
    again = JobSubmission.model_validate_json(
        '{"metadata": {}, "request": {"messages": [{"content": "same", "role": "user"}], "model": "m", "n": 1}}'
    )
    retried = service(config).submit(TENANT, again, "same-request")
    # THEN it is the same job, not created again
    assert (retried.job.job_id, retried.created) == (first.job.job_id, False)


def test_a_body_left_by_a_request_still_in_progress_holds_the_key_with_a_409(config):
    # GIVEN a body stored just now under a key's request (its request has not created its job yet)
    request_key = leave_a_body_without_a_job(config, "in-flight", "the first")
    # WHEN a different request comes with the key
    with pytest.raises(ServiceError) as refused:
        service(config).submit(TENANT, submission("the second"), "in-flight")
    # THEN it is told to retry, and the first body stays
    assert (refused.value.kind, refused.value.code) == (ErrorKind.CONFLICT, "idempotency_key_in_progress")
    stored = client("s3").get_object(Bucket=config.bucket_name, Key=request_key)["Body"].read()
    assert b"the first" in stored


def test_a_body_left_longer_ago_than_a_request_can_run_binds_the_key_to_nothing(config):
    # GIVEN a body whose request ended without creating its job (older than the in-progress window; 0 s here)
    request_key = leave_a_body_without_a_job(config, "abandoned", "the one that failed")
    # WHEN a different request comes with the key
    submitted = service(config, in_progress_s=0).submit(TENANT, submission("the retry"), "abandoned")
    # THEN its job is created with its own body, which replaced the abandoned one
    assert submitted.created
    assert submitted.job.request_key == request_key
    stored = client("s3").get_object(Bucket=config.bucket_name, Key=request_key)["Body"].read()
    assert b"the retry" in stored


def test_jobs_stored_before_fingerprints_match_any_retry_as_before(config):
    # GIVEN a job whose record has no fingerprint (created by the previous version)
    first = service(config).submit(TENANT, submission("old"), "old-job")
    JobStore(config.table_name)._table.update_item(
        Key={settings.TABLE_PARTITION_KEY: first.job.job_id}, UpdateExpression="REMOVE request_fingerprint"
    )
    # WHEN a retry comes with its key
    retried = service(config).submit(TENANT, submission("old, but different"), "old-job")
    # THEN it gets that job, as it did before fingerprints
    assert (retried.job.job_id, retried.created) == (first.job.job_id, False)
