"""A background response's webhook on the local stack (issue 20): the unmodified openai SDK creates the response with
a webhook (extra_body) and unwraps the delivery with its own verifier into OpenAI's response.completed event."""

from __future__ import annotations

import openai
import pytest

from async_inference.webhooks.receiver import Receiver
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS

pytestmark = pytest.mark.e2e
KEY_A = next(key for key, tenant in TENANT_KEYS.items() if tenant == "tenant-a")


def test_a_background_responses_end_reaches_its_webhook_as_openais_signed_event(stack: LocalDeployment, worker):
    # GIVEN a receiver and the SDK
    sdk = openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)
    with Receiver() as receiver:
        # WHEN a background response is created with a webhook and runs to its end
        created = sdk.responses.create(
            model="echo-model",
            input="tell me when done",
            background=True,
            extra_body={"webhook": {"url": receiver.url}},
        )
        [delivery] = receiver.wait_for(1, timeout_s=60)
    # THEN the SDK verifies the delivery with the tenant's secret and parses it as OpenAI's response.completed event
    event = sdk.webhooks.unwrap(delivery.body, delivery.headers, secret=stack.webhook_secrets["tenant-a"])
    assert type(event).__name__ == "ResponseCompletedWebhookEvent"
    assert event.type == "response.completed" and event.data.id == created.id
    assert sdk.responses.retrieve(created.id).status == "completed"
