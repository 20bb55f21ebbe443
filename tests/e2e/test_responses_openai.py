"""Background responses end to end with the official ``openai`` SDK, unmodified, against the local stack (deployed from
the template: its routes, its authorizer, the API function), a worker with the echo engine doing the job underneath.

No worker runs unless a test starts one (the ``worker`` fixture): a response created without one stays ``queued``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import requests

from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS

pytestmark = pytest.mark.e2e
KEY_A, KEY_B = list(TENANT_KEYS)


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def other_sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_B, max_retries=0)


def until(check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def final(sdk: openai.OpenAI, response_id: str) -> Any:
    """The response once it has left queued and in_progress (as a client polls: retrieve until final)."""
    response = until(lambda: (r := sdk.responses.retrieve(response_id)).status not in ("queued", "in_progress") and r)
    assert response, f"response {response_id} is still {sdk.responses.retrieve(response_id).status}"
    return response


def test_a_background_response_completes_with_output_text_and_usage(sdk, worker):
    # GIVEN a worker WHEN the SDK creates a background response THEN it is answered at once, queued, as a Response
    created = sdk.responses.create(
        model="echo-model",
        input="the quick brown fox",
        instructions="repeat it",
        background=True,
        metadata={"case": "complete"},
    )
    assert (created.object, created.status, created.background) == ("response", "queued", True)
    assert created.id.startswith("resp_") and created.metadata == {"case": "complete"}
    # WHEN it is retrieved until final THEN it completed with the echoed text and the tokens it used
    response = final(sdk, created.id)
    assert response.status == "completed", response.error
    assert response.output_text == "the quick brown fox"
    assert response.output[0].type == "message" and response.output[0].content[0].type == "output_text"
    assert response.usage.output_tokens == 4 and response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.instructions == "repeat it" and response.completed_at is not None
    # AND a completed response cannot be cancelled: 409, which names it
    with pytest.raises(openai.ConflictError) as caught:
        sdk.responses.cancel(created.id)
    assert created.id in caught.value.message and "completed" in caught.value.message


def test_a_response_cut_at_max_output_tokens_is_incomplete(sdk, worker):
    created = sdk.responses.create(
        model="echo-model", input="one two three four five", max_output_tokens=2, background=True
    )
    response = final(sdk, created.id)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "one two" and response.usage.output_tokens == 2


def test_the_response_is_a_job_underneath(sdk, stack):
    # GIVEN a response WHEN its job is read through the jobs API THEN it is the same work: a queued job that runs the
    # converted chat request, with the response's metadata
    created = sdk.responses.create(model="echo-model", input="hello", background=True, metadata={"k": "v"})
    job_id = "job_" + created.id.removeprefix("resp_")
    job = requests.get(f"{stack.api_url}/v1/jobs/{job_id}", headers={"x-api-key": KEY_A})
    assert job.status_code == 200 and job.json()["metadata"] == {"k": "v"} and job.json()["model"] == "echo-model"
    sdk.responses.cancel(created.id)


def test_cancelling_a_queued_response_makes_it_cancelled(sdk):
    # GIVEN a queued response (no worker runs) WHEN the SDK cancels it THEN it is cancelled, and stays so
    created = sdk.responses.create(model="echo-model", input="never run", background=True)
    cancelled = sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.id == created.id
    assert sdk.responses.retrieve(created.id).status == "cancelled"
    assert sdk.responses.cancel(created.id).status == "cancelled"  # again: the same answer, as OpenAI's


def test_another_tenants_response_is_a_404(sdk, other_sdk):
    # GIVEN tenant A's response WHEN tenant B retrieves, cancels, deletes or lists it THEN each is a 404
    created = sdk.responses.create(model="echo-model", input="mine", background=True)
    for call in (
        lambda: other_sdk.responses.retrieve(created.id),
        lambda: other_sdk.responses.cancel(created.id),
        lambda: other_sdk.responses.delete(created.id),
        lambda: list(other_sdk.responses.input_items.list(created.id)),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert sdk.responses.retrieve(created.id).status == "queued"  # untouched
    sdk.responses.cancel(created.id)


def test_input_items_list_the_input(sdk):
    # GIVEN a response whose input is a conversation WHEN its input items are listed THEN they are the input, newest
    # first by default (OpenAI's order), oldest first with order=asc
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
    ]
    created = sdk.responses.create(model="echo-model", input=history, instructions="not an item", background=True)
    listed = list(sdk.responses.input_items.list(created.id, order="asc"))
    assert [(i.role, i.content[0].text) for i in listed] == [
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "and now?"),
    ]
    newest = sdk.responses.input_items.list(created.id, limit=1)
    assert [i.content[0].text for i in newest.data] == ["and now?"] and newest.has_more
    sdk.responses.cancel(created.id)


def test_a_deleted_response_is_gone(sdk):
    created = sdk.responses.create(model="echo-model", input="forget me", background=True)
    sdk.responses.delete(created.id)  # an unfinished one is cancelled first
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"store": False}, "store"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(sdk, changes, field):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="echo-model", input="hi", background=True, **changes)
    assert caught.value.body["details"][0]["field"] == field, caught.value.message


def test_a_model_not_served_is_a_404_model_not_found(sdk):
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="gpt-4o", input="hi", background=True)
    assert caught.value.code == "model_not_found"


def test_an_idempotency_key_replays_the_same_response_and_refuses_another_body(sdk):
    # GIVEN a response created with an Idempotency-Key WHEN the same request is sent again with it THEN the same
    # response answers; WHEN another body is sent with it THEN 422, and the first response's input is unchanged
    key = {"Idempotency-Key": f"resp-key-{time.monotonic_ns()}"}
    first = sdk.responses.create(model="echo-model", input="once", background=True, extra_headers=key)
    again = sdk.responses.create(model="echo-model", input="once", background=True, extra_headers=key)
    assert again.id == first.id
    with pytest.raises(openai.UnprocessableEntityError):
        sdk.responses.create(model="echo-model", input="another", background=True, extra_headers=key)
    assert [i.content[0].text for i in sdk.responses.input_items.list(first.id)] == ["once"]
    sdk.responses.cancel(first.id)
