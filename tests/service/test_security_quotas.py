"""Per-tenant quotas at submit, against a real moto server over HTTP: a tenant with ``max_active_jobs`` unfinished
jobs gets a 429 that names the limit; a job that ends frees its place; other tenants are not affected.

The job table is created as the template declares it: the tenant listing index and the sparse index of unfinished
jobs (cdk/job_table.py), from the same settings.
"""

from __future__ import annotations

import pytest

from async_inference import settings
from async_inference.aws import Blobs, JobStore, Notifier, client
from async_inference.fleets import ANY_MODEL, FleetRoute
from async_inference.jobs import JobStatus
from async_inference.jobs_service import ErrorKind, JobService, ServiceError
from async_inference.quotas import TenantQuota
from async_inference.schemas import ChatCompletionRequest, JobSubmission, UploadSpec
from local_runtime.moto_server import MotoServer, free_port

LIMITED, OTHER = "tenant-limited", "tenant-other"


def chat() -> JobSubmission:
    return JobSubmission(request=ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}]))


@pytest.fixture(scope="module")
def service(moto: MotoServer) -> JobService:
    string = "S"
    client("s3").create_bucket(Bucket="claim-checks")
    client("dynamodb").create_table(
        TableName="jobs",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": name, "AttributeType": string}
            for name in (
                settings.TABLE_PARTITION_KEY,
                settings.TENANT_INDEX_PARTITION_KEY,
                settings.TENANT_INDEX_SORT_KEY,
                settings.ACTIVE_JOBS_ATTRIBUTE,
            )
        ],
        KeySchema=[{"AttributeName": settings.TABLE_PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": settings.TENANT_INDEX_NAME,
                "Projection": {"ProjectionType": "ALL"},
                "KeySchema": [
                    {"AttributeName": settings.TENANT_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": settings.TENANT_INDEX_SORT_KEY, "KeyType": "RANGE"},
                ],
            },
            {
                "IndexName": settings.ACTIVE_JOBS_INDEX_NAME,
                "Projection": {"ProjectionType": "KEYS_ONLY"},
                "KeySchema": [{"AttributeName": settings.ACTIVE_JOBS_ATTRIBUTE, "KeyType": "HASH"}],
            },
        ],
    )
    queue = client("sqs").create_queue(QueueName=f"jobs-{free_port()}")["QueueUrl"]
    topic = client("sns").create_topic(Name="results")["TopicArn"]
    return JobService(
        store=JobStore("jobs"),
        blobs=Blobs("claim-checks"),
        fleets={ANY_MODEL: FleetRoute(queue_url=queue)},
        notifier=Notifier(topic),
        quotas={LIMITED: TenantQuota(max_active_jobs=3)},
    )


def test_a_tenant_at_its_active_job_limit_gets_a_429_naming_it_until_a_job_ends(service):
    # GIVEN a tenant limited to 3 unfinished jobs, with 2 queued and 1 awaiting its upload
    jobs = [service.api.submit(LIMITED, chat(), None).job for _ in range(2)]
    jobs.append(service.api.submit(LIMITED, JobSubmission(upload=UploadSpec(size_bytes=10)), None).job)
    # WHEN it submits a fourth
    with pytest.raises(ServiceError) as refused:
        service.api.submit(LIMITED, chat(), None)
    # THEN it is a 429 quota_exceeded that names the limit and its value
    assert refused.value.kind is ErrorKind.QUOTA and refused.value.code == "quota_exceeded"
    assert "max_active_jobs" in refused.value.message and "3 jobs" in refused.value.message
    # AND once one of its jobs ends (cancelled here; any final state), it may submit one more, and only one
    service.api.cancel(LIMITED, jobs[0].job_id)
    assert service.api.submit(LIMITED, chat(), None).job.status is JobStatus.QUEUED
    with pytest.raises(ServiceError):
        service.api.submit(LIMITED, chat(), None)


def test_another_tenant_is_not_held_by_the_limited_ones_jobs(service):
    # GIVEN the limited tenant at its limit (the test above, or these submits)
    for _ in range(3):
        try:
            service.api.submit(LIMITED, chat(), None)
        except ServiceError:
            break
    # WHEN another tenant, whose plan sets no limit, submits THEN it is queued (the default limit applies to it)
    assert service.store.count_active(OTHER, up_to=settings.DEFAULT_MAX_ACTIVE_JOBS) == 0
    assert service.api.submit(OTHER, chat(), None).job.status is JobStatus.QUEUED


def test_every_final_state_leaves_the_count_and_a_retry_with_an_idempotency_key_is_not_counted_twice(service):
    # GIVEN a tenant with one job in each way a job can end, plus an unfinished one
    tenant = "tenant-ends"
    ended = [service.api.submit(tenant, chat(), None).job for _ in range(3)]
    service.store.transition(ended[0].job_id, JobStatus.RUNNING)
    service.store.transition(ended[0].job_id, JobStatus.FAILED, error="x")
    service.store.transition(ended[1].job_id, JobStatus.EXPIRED)
    service.api.cancel(tenant, ended[2].job_id)
    first = service.api.submit(tenant, chat(), "key-1")
    # WHEN the unfinished one's submit is retried with its Idempotency-Key
    again = service.api.submit(tenant, chat(), "key-1")
    # THEN the tenant counts one unfinished job
    assert again.job.job_id == first.job.job_id and not again.created
    assert service.store.count_active(tenant, up_to=100) == 1
