"""Per-job webhooks end to end: submit with a webhook, a worker runs the job, the dispatcher POSTs a signed delivery
to a local receiver, retries on failure, ends in the webhook DLQ, and records every attempt on the job.

The local stack retries a failed delivery every second (``LOCAL_WEBHOOK_BACKOFF``), so these take seconds."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from async_inference import settings
from async_inference.aws import JobStore, Notifier, client
from async_inference.jobs_service import build_notification
from async_inference.schemas import JobView, ResultNotification
from async_inference.webhooks.receiver import Receiver
from async_inference_client import ApiError, Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import chat

pytestmark = pytest.mark.e2e


@pytest.fixture
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    statuses = getattr(request, "param", ())
    with Receiver(statuses=statuses) as local:
        yield local


def webhook_settled(api: Client, job_id: str, *, attempts: int, timeout_s: float) -> JobView:
    """The job once its webhook is no longer pending and has ``attempts`` attempts (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = api.get(job_id)
        hook = job.webhook
        if (hook.status != "pending" and len(hook.attempts) >= attempts) or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def test_completed_webhook_is_signed_with_the_tenant_secret_and_carries_the_notification(
    stack: LocalDeployment, api: Client, worker, receiver: Receiver
):
    # GIVEN a job submitted with a webhook to a local receiver
    submitted = api.submit(
        chat("sign this please", max_tokens=2), webhook={"url": receiver.url, "events": ["completed"]}
    )
    assert submitted.webhook.model_dump() == {
        "url": receiver.url,
        "events": ["completed"],
        "status": "pending",
        "attempts": [],
    }
    # WHEN the job finishes
    final = api.wait(submitted.job_id, timeout_s=30)
    [delivery] = receiver.wait_for(1, timeout_s=15)

    # THEN the delivery verifies with the tenant's secret (standardwebhooks' own verifier)
    payload = Webhook(stack.webhook_secrets["tenant-a"]).verify(delivery.body, delivery.headers)
    assert delivery.headers["webhook-id"] == f"{submitted.job_id}_completed"
    # AND its body is the versioned result notification, with the small result inline and equal to the stored one
    note = ResultNotification.model_validate(payload)
    assert (note.schema_version, note.event, note.job_id, note.status.value) == (
        "1",
        "job.completed",
        final.job_id,
        "succeeded",
    )
    assert note.result is not None and note.result.model_dump(mode="json") == api.result(final).model_dump(mode="json")
    # AND another tenant's secret does not verify it
    with pytest.raises(WebhookVerificationError):
        Webhook(stack.webhook_secrets["tenant-b"]).verify(delivery.body, delivery.headers)
    # AND the job shows the webhook delivered, with one attempt
    job = webhook_settled(api, submitted.job_id, attempts=1, timeout_s=10)
    assert job.webhook.status == "delivered"
    assert [a.status_code for a in job.webhook.attempts] == [200]


@pytest.mark.parametrize("receiver", [(500, 500)], indirect=True)
def test_receiver_answering_500_twice_then_200_gets_three_attempts_and_the_job_shows_delivered(
    api: Client, worker, receiver: Receiver
):
    # GIVEN a receiver that answers 500, 500, then 200
    submitted = api.submit(chat("retry me", max_tokens=2), webhook={"url": receiver.url})
    # WHEN the job finishes
    api.wait(submitted.job_id, timeout_s=30)
    deliveries = receiver.wait_for(3, timeout_s=20)
    job = webhook_settled(api, submitted.job_id, attempts=3, timeout_s=10)

    # THEN three attempts of the same message arrived, each after a backoff
    assert len(deliveries) == 3
    assert len({d.headers["webhook-id"] for d in deliveries}) == 1 and len({d.body for d in deliveries}) == 1
    gaps = [later.received_at - earlier.received_at for earlier, later in zip(deliveries, deliveries[1:], strict=False)]
    assert all(gap >= 0.9 for gap in gaps), gaps
    # AND the job records all three and shows the webhook delivered
    assert [a.status_code for a in job.webhook.attempts] == [500, 500, 200]
    assert [a.error for a in job.webhook.attempts[:2]] == ["HTTP 500", "HTTP 500"]
    assert job.webhook.status == "delivered"
    time.sleep(1.5)
    assert len(receiver.deliveries) == 3, "a delivered webhook is not sent again"


@pytest.mark.parametrize("receiver", [(302,) + (503,) * 20], indirect=True)
def test_receiver_that_always_fails_ends_in_the_webhook_dlq_and_the_job_keeps_its_result(
    stack: LocalDeployment, api: Client, worker, receiver: Receiver
):
    # GIVEN a receiver that redirects once, then answers 503 for ever
    submitted = api.submit(chat("nobody listens", max_tokens=2), webhook={"url": receiver.url})
    # WHEN the job finishes and every delivery fails
    final = api.wait(submitted.job_id, timeout_s=30)
    job = webhook_settled(api, submitted.job_id, attempts=settings.WEBHOOK_MAX_RECEIVE_COUNT, timeout_s=40)

    # THEN the dispatcher tried the maximum number of times (the redirect was not followed), and the job says failed
    attempts = job.webhook.attempts
    assert job.webhook.status == "failed"
    assert [a.status_code for a in attempts] == [302] + [503] * (settings.WEBHOOK_MAX_RECEIVE_COUNT - 1)
    assert len(receiver.deliveries) == settings.WEBHOOK_MAX_RECEIVE_COUNT
    # AND the message is in the webhook DLQ
    assert stack.resources is not None
    assert _wait_in_queue(stack.resources.webhook_dlq_url, submitted.job_id, timeout_s=10)
    # AND the job still has its result, in S3 and on the job
    assert job.status == "succeeded"
    assert api.result(final).choices[0].message.content == "nobody listens"


def _wait_in_queue(url: str, needle: str, timeout_s: float) -> bool:
    """Whether a message containing ``needle`` is on the queue (peeked: left visible for other readers)."""
    sqs = client("sqs")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=1)
        if any(needle in m["Body"] for m in messages.get("Messages", [])):
            return True
    return False


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "metadata"),  # EC2 instance metadata
        ("https://[fd00:ec2::254]/", "metadata"),  # the same over IPv6
        ("https://2852039166/", "metadata"),  # 169.254.169.254 written as one number
        ("https://[::ffff:169.254.169.254]/", "metadata"),  # IPv4-mapped IPv6
        ("https://10.0.0.8/hook", "private"),
        ("https://192.168.1.1/hook", "private"),
        ("https://[fe80::1]/hook", "link-local"),
        ("https://0.0.0.0/hook", "not a unicast"),
        ("ftp://127.0.0.1/hook", "https://"),
        ("https://user:pw@127.0.0.1/hook", "credentials"),
        ("https://127.0.0.1/" + "a" * 2100, "2048"),
    ],
)
def test_unsafe_webhook_urls_are_refused_with_400_naming_the_field(api: Client, url: str, reason: str):
    # WHEN a job is submitted with a webhook URL that points inside the network, or is malformed
    with pytest.raises(ApiError) as refused:
        api.submit(chat("x"), webhook={"url": url})
    # THEN it is a 400 that names webhook.url and says why
    assert refused.value.status == 400
    error = refused.value.body["error"]
    assert error["details"][0]["field"] == "webhook.url"
    assert reason in error["details"][0]["message"]


def test_started_and_completed_webhooks_both_arrive_signed_and_are_recorded_per_event(
    stack: LocalDeployment, api: Client, worker, receiver: Receiver
):
    # GIVEN a job that asks for both events
    submitted = api.submit(
        chat("tell me twice", max_tokens=2), webhook={"url": receiver.url, "events": ["started", "completed"]}
    )
    # WHEN it runs to the end
    api.wait(submitted.job_id, timeout_s=30)
    deliveries = receiver.wait_for(2, timeout_s=15)
    # THEN one delivery per event, each verifying with the tenant's secret
    ids = sorted(d.headers["webhook-id"] for d in deliveries)
    assert ids == [f"{submitted.job_id}_completed", f"{submitted.job_id}_started"]
    for delivery in deliveries:
        Webhook(stack.webhook_secrets["tenant-a"]).verify(delivery.body, delivery.headers)
    # AND the job records an attempt for each event
    job = webhook_settled(api, submitted.job_id, attempts=2, timeout_s=10)
    assert sorted(a.event for a in job.webhook.attempts) == ["completed", "started"]


def _publish_notifications(stack: LocalDeployment, job_ids: list[str]) -> float:
    """Publish the jobs' result notifications to the result topic in one request, as the worker does; when (wall
    clock, as the receiver's)."""
    assert stack.resources is not None
    store = JobStore(stack.resources.config.table_name)
    notes = [
        (build_notification(store.get(job_id), result=None, bucket=stack.resources.config.bucket_name), True)
        for job_id in job_ids
    ]
    published = time.time()
    assert all(Notifier(stack.resources.config.topic_arn).publish_batch(notes))
    return published


def test_a_tenant_whose_receiver_hangs_does_not_hold_back_another_tenants_delivery(
    stack: LocalDeployment, api: Client, other_api: Client
):
    deadline_s = settings.WEBHOOK_DELIVERY_TIMEOUT_S
    with Receiver(hang_s=3 * deadline_s) as hanging, Receiver() as healthy:
        # GIVEN tenant A's jobs whose receiver hangs, and tenant B's job whose receiver answers at once
        first, *slow = [api.submit(chat(f"slow {i}"), webhook={"url": hanging.url}).job_id for i in range(3)]
        fast = other_api.submit(chat("fast"), webhook={"url": healthy.url}).job_id
        try:
            # AND the dispatcher busy with A's delivery to the hanging receiver
            _publish_notifications(stack, [first])
            [first_delivery] = hanging.wait_for(1, timeout_s=20)
            # WHEN A's next two events and then B's are published while it hangs
            published = _publish_notifications(stack, [*slow, fast])
            [delivery] = healthy.wait_for(1, timeout_s=4 * deadline_s)
        finally:
            for job_id in (first, *slow):
                api.cancel(job_id)
            other_api.cancel(fast)
    # THEN B's delivery arrived at once, before A's hanging delivery reached its deadline: B's events wait behind no
    # invocation of A's (a webhook queue and event source per tenant, cdk/webhook_dispatch.py); on one shared queue it
    # waited for that deadline
    assert delivery.headers["webhook-id"] == f"{fast}_completed"
    assert delivery.received_on - published < deadline_s / 2, delivery.received_on - published
    assert delivery.received_on < first_delivery.received_on + deadline_s
    # (What A's own later events cost A, a receiver and a tenant left alone after a deadline, is per execution
    # environment: tests/unit/test_webhooks_core.py.)


def test_an_operator_reads_a_tenants_signing_secret_with_the_cli(stack: LocalDeployment, capsys):
    # GIVEN the tenants' signing secrets the deploy generated (the stack output WebhookSigningSecretArns), as an
    # operator's AWS access reads them
    from async_inference import cli

    assert stack.resources is not None
    arns = json.dumps(stack.resources.webhook_secret_arns)
    # WHEN the operator asks for a tenant's secret
    assert cli.main(["webhook-secret", "tenant-a", "--secret-arns", arns]) == 0
    # THEN it prints that tenant's secret, the one deliveries are signed with
    assert capsys.readouterr().out.split() == [stack.webhook_secrets["tenant-a"]]
    # AND --json gives it for scripts
    assert cli.main(["--json", "webhook-secret", "tenant-b", "--secret-arns", arns]) == 0
    assert json.loads(capsys.readouterr().out) == {"tenant": "tenant-b", "secrets": [stack.webhook_secrets["tenant-b"]]}
    # AND a tenant without a secret is an error that names the ones there are
    assert cli.main(["webhook-secret", "nobody", "--secret-arns", arns]) == 2
    error = capsys.readouterr().err
    assert "nobody" in error and "tenant-a" in error
