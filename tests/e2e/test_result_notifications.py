"""The SNS result notification end to end: its attributes let subscriptions filter, and a small result travels inline."""

from __future__ import annotations

import pytest

from async_inference import settings
from async_inference.aws import client
from async_inference.jobs_service import JobService
from async_inference.schemas import JobView, ResultNotification
from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import Subscriber, chat

pytestmark = pytest.mark.e2e


def run_worker_until(stack: LocalDeployment, api: Client, job_id: str) -> JobView:
    process = stack.start_worker()
    try:
        return api.wait(job_id, timeout_s=30)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_status_filter_policy_delivers_only_matching_statuses_to_an_sqs_subscriber(
    stack: LocalDeployment, api: Client, subscriber: Subscriber
):
    # GIVEN an SQS subscriber that wants failed and cancelled jobs only
    failures = Subscriber(stack, filter_policy={"status": ["failed", "cancelled"]})
    # WHEN one job is cancelled and another succeeds
    cancelled = api.cancel(api.submit(chat("cancel me")).job_id)
    succeeded = api.submit(chat("let me finish", max_tokens=2))
    assert run_worker_until(stack, api, succeeded.job_id).status == "succeeded"

    # THEN the filtered subscriber got the cancelled job only, while an unfiltered one got both
    assert [n["status"] for n in failures.for_job(cancelled.job_id)] == ["cancelled"]
    assert failures.for_job(succeeded.job_id, wait_s=1.5) == []
    assert [n["status"] for n in subscriber.for_job(succeeded.job_id)] == ["succeeded"]
    assert [n["status"] for n in subscriber.for_job(cancelled.job_id)] == ["cancelled"]


def test_tenant_and_model_filter_policy_delivers_only_that_tenants_jobs_for_that_model(
    stack: LocalDeployment, api: Client, other_api: Client
):
    # GIVEN a subscriber that wants tenant-b's jobs for one model
    tenant_b = Subscriber(stack, filter_policy={"tenant": ["tenant-b"], "model": ["model-x"]})
    # WHEN each tenant's job for that model, and tenant-b's job for another model, end
    wanted = other_api.cancel(other_api.submit(chat("b", model="model-x")).job_id)
    other_model = other_api.cancel(other_api.submit(chat("b", model="model-y")).job_id)
    other_tenant = api.cancel(api.submit(chat("a", model="model-x")).job_id)

    # THEN only tenant-b's model-x job reaches it, with its attributes
    tenant_b.drain(wait_s=1.5)
    assert set(tenant_b.by_job) == {wanted.job_id}
    assert tenant_b.attributes[wanted.job_id] == [
        {"status": "cancelled", "tenant": "tenant-b", "model": "model-x", "webhook": "false", "event": "job.completed"}
    ]
    assert other_model.job_id not in tenant_b.by_job and other_tenant.job_id not in tenant_b.by_job


def test_small_result_travels_inline_in_the_notification_and_equals_the_stored_result(
    stack: LocalDeployment, api: Client, subscriber: Subscriber
):
    # GIVEN a job whose result is well under 128 KB
    submitted = api.submit(chat("inline result please", max_tokens=3))
    # WHEN it succeeds
    final = run_worker_until(stack, api, submitted.job_id)
    # THEN the notification validates against the versioned schema and carries the result itself and its location
    [raw] = subscriber.for_job(submitted.job_id)
    note = ResultNotification.model_validate(raw)
    assert note.schema_version == "1" and note.status.value == "succeeded"
    assert note.result is not None and note.result.model_dump(mode="json") == api.result(final).model_dump(mode="json")
    assert note.result_location is not None and note.result_location.key == settings.result_key(
        "tenant-a", final.job_id
    )
    assert note.usage is not None and note.usage.completion_tokens == 3
    assert note.timings.run_s is not None and note.timings.queue_s is not None


def test_result_over_128_kb_is_not_inline_but_its_location_is(
    stack: LocalDeployment, api: Client, subscriber: Subscriber
):
    # GIVEN a job whose result is larger than the inline limit (4096 words of 35 characters)
    words = ["w" * 34] * settings.MAX_TOKENS_LIMIT
    submitted = api.submit(chat(" ".join(words), max_tokens=settings.MAX_TOKENS_LIMIT))
    # WHEN it succeeds
    final = run_worker_until(stack, api, submitted.job_id)
    assert final.status == "succeeded", final
    # THEN the notification leaves the result out and points at it in S3
    [raw] = subscriber.for_job(submitted.job_id)
    assert "result" not in raw
    assert raw["result_location"]["key"] == settings.result_key("tenant-a", final.job_id)
    assert len(api.result(final).choices[0].message.content) > settings.MAX_INLINE_RESULT_BYTES


def test_notified_marks_are_per_job_so_a_job_gone_from_the_table_does_not_block_the_others(
    stack: LocalDeployment, api: Client, subscriber: Subscriber
):
    # GIVEN two final jobs whose notifications are not yet recorded, one of them since removed from the table (TTL)
    assert stack.resources is not None
    service = JobService.from_config(stack.resources.config)
    kept, gone = (api.cancel(api.submit(chat(text)).job_id).job_id for text in ("kept", "gone"))
    for job_id in (kept, gone):
        client("dynamodb").update_item(
            TableName=stack.resources.config.table_name,
            Key={settings.TABLE_PARTITION_KEY: {"S": job_id}},
            UpdateExpression="SET notified = :no",
            ExpressionAttributeValues={":no": {"BOOL": False}},
        )
    jobs = [service.store.get(kept), service.store.get(gone)]
    client("dynamodb").delete_item(
        TableName=stack.resources.config.table_name, Key={settings.TABLE_PARTITION_KEY: {"S": gone}}
    )
    # WHEN the worker's batched path notifies both
    published = service.outcomes.notify_many([(job, None) for job in jobs])  # type: ignore[misc]
    # THEN both went out (after the one each got when cancelled), the job still in the table has its notification
    # recorded, and the gone job was not written back as a stub item
    assert published == [True, True]
    assert (
        [n["status"] for n in subscriber.for_job(kept)]
        == [n["status"] for n in subscriber.for_job(gone)]
        == ["cancelled"] * 2
    )
    assert service.store.get(kept).notified is True
    assert service.store.get(gone) is None
