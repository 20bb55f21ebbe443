"""Per-batch webhooks end to end: the official SDK creates a batch with ``extra_body={"webhook": {...}}``, the batch
ends, and the template's webhook dispatcher (the one job webhooks use) POSTs OpenAI's webhook event, signed with the
tenant's Standard Webhooks secret, to a local receiver, recording the attempt on the batch."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from async_inference.batches.store import BatchStore
from async_inference.webhooks.receiver import Receiver
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS
from tests.e2e.test_batches_openai import jsonl, line, settled, upload

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))
EVENT_FIELDS = {"id", "object", "type", "created_at", "data"}


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as local:
        yield local


def _create(sdk: openai.OpenAI, data: bytes, webhook: dict) -> openai.types.Batch:
    source = upload(sdk, data)
    return sdk.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"webhook": webhook},
    )


def _webhook_settled(stack: LocalDeployment, batch_id: str, timeout_s: float = 15.0):
    store = BatchStore(stack.resources.batch_table_name)
    deadline = time.monotonic() + timeout_s
    while True:
        record = store.get_batch(batch_id)
        if (record.webhook and record.webhook.status != "pending") or time.monotonic() > deadline:
            return record.webhook
        time.sleep(0.2)


def test_a_completed_batch_posts_a_signed_batch_completed_event(stack: LocalDeployment, sdk, worker, receiver):
    # GIVEN a batch created through the SDK with a webhook to a local receiver
    batch = _create(sdk, jsonl([line("w-1"), line("w-2")]), {"url": receiver.url})
    # WHEN a worker runs it to completed
    settled(sdk, batch.id, "completed", timeout_s=120)
    [delivery] = receiver.wait_for(1, timeout_s=20)
    # THEN the delivery verifies with the tenant's secret (standardwebhooks' own verifier), and not with another's
    payload = Webhook(stack.webhook_secrets["tenant-a"]).verify(delivery.body, delivery.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(stack.webhook_secrets["tenant-b"]).verify(delivery.body, delivery.headers)
    # AND its body is OpenAI's webhook event, nothing more: id, object "event", type, created_at, data {id}
    assert set(payload) == EVENT_FIELDS
    assert (payload["object"], payload["type"], payload["data"]) == ("event", "batch.completed", {"id": batch.id})
    assert payload["id"].startswith("evt_") and delivery.headers["webhook-id"] == payload["id"]
    assert isinstance(payload["created_at"], int)
    # AND the batch records the delivery
    hook = _webhook_settled(stack, batch.id)
    assert (hook.url, hook.status, [a.status_code for a in hook.attempts]) == (receiver.url, "delivered", [200])


def test_a_batch_that_fails_validation_posts_batch_failed(stack: LocalDeployment, sdk, receiver):
    # GIVEN a batch whose input has a line that is not JSON, with a webhook WHEN the controller fails it
    batch = _create(sdk, jsonl([line("ok"), b"{not json"]), {"url": receiver.url})
    settled(sdk, batch.id, "failed")
    # THEN the receiver gets batch.failed, signed
    [delivery] = receiver.wait_for(1, timeout_s=20)
    payload = Webhook(stack.webhook_secrets["tenant-a"]).verify(delivery.body, delivery.headers)
    assert (payload["type"], payload["data"]) == ("batch.failed", {"id": batch.id})


def test_an_event_the_webhook_did_not_ask_for_is_not_posted(stack: LocalDeployment, sdk, receiver):
    # GIVEN a batch whose webhook asks for batch.completed only WHEN it fails validation
    batch = _create(sdk, jsonl([b"{not json"]), {"url": receiver.url, "events": ["batch.completed"]})
    settled(sdk, batch.id, "failed")
    # THEN nothing is posted
    assert receiver.wait_for(1, timeout_s=5) == []


def test_an_unsafe_webhook_url_is_a_400_naming_the_field(sdk):
    source = upload(sdk, jsonl([line("x")]))
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.batches.create(
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"webhook": {"url": "http://169.254.169.254/latest/meta-data"}},
        )
    assert refused.value.body["message"].startswith("webhook.url")
