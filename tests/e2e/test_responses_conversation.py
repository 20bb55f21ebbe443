"""Conversation state end to end with the official ``openai`` SDK, unmodified, against the local stack:
``previous_response_id`` continues a stored response (background and held), and ``truncation``.

The echo engine counts a prompt's tokens as the words of all its messages, so a response's ``usage.input_tokens`` says
exactly which history its job ran: the earlier turns' inputs and outputs, without their instructions.
"""

from __future__ import annotations

import openai
import pytest

from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS
from tests.e2e.test_responses_openai import final

pytestmark = pytest.mark.e2e
KEY_A, KEY_B = list(TENANT_KEYS)
# 7,500 words of 26 bytes: 195 KB, which the API estimates at 24,375 tokens (8 bytes a token at most): one such input
# fits the default 32,768-token context, two do not.
LONG = "abcdefghijklmnopqrstuvwxy " * 7_500


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def other_sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_B, max_retries=0)


def completed(sdk: openai.OpenAI, **fields) -> openai.types.responses.Response:
    response = final(sdk, sdk.responses.create(model="echo-model", background=True, **fields).id)
    assert response.status in ("completed", "incomplete"), response.error
    return response


def field_of(error: openai.APIStatusError) -> str:
    return error.body["details"][0]["field"]


def test_a_background_chain_runs_each_earlier_turn_without_its_instructions(sdk, worker):
    # GIVEN a completed response with instructions (4 words in, 4 echoed out)
    first = completed(sdk, input="my name is Ada", instructions="answer in one word")
    # WHEN a second continues it, and a third the second
    second = completed(sdk, input="what is it", previous_response_id=first.id)
    third = completed(sdk, input="spell it", previous_response_id=second.id)
    # THEN each ran the earlier turns' input and output, then its own input, without the first one's instructions
    assert second.usage.input_tokens == 4 + 4 + 3, second.usage
    assert third.usage.input_tokens == (4 + 4 + 3) + 3 + 2, third.usage
    # AND each Response names the one it continues
    assert (second.previous_response_id, third.previous_response_id) == (first.id, second.id)
    assert third.output_text == "spell it"


def test_a_held_response_continues_a_stored_one(sdk, worker):
    # GIVEN a response created as a client creates it against OpenAI (held until it ends)
    first = sdk.responses.create(model="echo-model", input="the sky is blue")
    assert first.status == "completed"
    # WHEN the next one continues it, held as well
    second = sdk.responses.create(model="echo-model", input="what colour", previous_response_id=first.id)
    # THEN it completed having run the first turn's input and output before its own
    assert second.status == "completed" and second.usage.input_tokens == 4 + 4 + 2, second.usage


def test_another_tenants_response_cannot_be_continued(sdk, other_sdk, worker):
    # GIVEN a completed response of another tenant
    theirs = completed(other_sdk, input="a secret")
    # WHEN a tenant names it as its previous response THEN it is not found, as an unknown one
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="echo-model", input="tell me", previous_response_id=theirs.id, background=True)
    assert field_of(caught.value) == "previous_response_id" and theirs.id in caught.value.message


@pytest.mark.parametrize("which", ["deleted", "unknown", "not an id"])
def test_a_deleted_or_unknown_previous_response_is_a_404_naming_it(sdk, worker, which):
    # GIVEN a response id that names no stored response of the tenant's
    if which == "deleted":
        previous = completed(sdk, input="soon gone").id
        sdk.responses.delete(previous)
    else:
        previous = "resp_" + "0" * 32 if which == "unknown" else "resp_123"
    # WHEN a response continues it THEN the answer is a 404 naming previous_response_id
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.create(model="echo-model", input="go on", previous_response_id=previous)
    assert field_of(caught.value) == "previous_response_id" and previous in caught.value.message
    assert caught.value.code == "previous_response_not_found"


def test_a_previous_response_that_has_not_completed_is_a_400(sdk):
    # GIVEN a background response still queued (no worker runs)
    queued = sdk.responses.create(model="echo-model", input="not yet", background=True)
    try:
        # WHEN a response continues it THEN it is a 400 naming previous_response_id, saying to wait
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.responses.create(model="echo-model", input="go on", previous_response_id=queued.id, background=True)
        assert field_of(caught.value) == "previous_response_id" and "queued" in caught.value.message
    finally:
        sdk.responses.cancel(queued.id)


def test_a_cancelled_previous_response_is_a_400_naming_it(sdk):
    # GIVEN a background response cancelled before any worker ran it
    cancelled = sdk.responses.create(model="echo-model", input="never mind", background=True)
    sdk.responses.cancel(cancelled.id)
    # WHEN a response continues it THEN it is a 400 naming previous_response_id and what the response is
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="echo-model", input="go on", previous_response_id=cancelled.id)
    assert field_of(caught.value) == "previous_response_id" and "cancelled" in caught.value.message


def test_over_the_context_truncation_auto_drops_the_oldest_turn_and_disabled_is_a_400(sdk, worker):
    # GIVEN a stored response whose input fills most of the context (its output cut to 4 words)
    first = completed(sdk, input=LONG, max_output_tokens=4)
    # WHEN the next turn, as long, continues it without truncation THEN it is a 400 context_length_exceeded at input
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="echo-model", input=LONG, previous_response_id=first.id, background=True)
    assert caught.value.code == "context_length_exceeded" and field_of(caught.value) == "input", caught.value.body
    # WHEN it is sent with truncation "auto"
    second = completed(sdk, input=LONG, previous_response_id=first.id, truncation="auto", max_output_tokens=4)
    # THEN the first turn's input was dropped: the job ran its 4-word output and the new input, and says so
    assert second.usage.input_tokens == 4 + 7_500, second.usage
    assert second.truncation == "auto"
