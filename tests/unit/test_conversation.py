"""Conversation state of the Responses API (async_inference.conversation): the history a chain of stored responses
makes, and what ``truncation: "auto"`` drops from it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from async_inference import settings
from async_inference.conversation import MAX_CHAIN, Turn, fits, history, output_as_input, truncated
from async_inference.jobs_service import ErrorKind, ServiceError
from async_inference.limits import RequestLimits
from async_inference.response_service import ResponseService
from async_inference.responses import to_chat_request
from async_inference.schemas.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    ResponseCreate,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
)

LIMITS = RequestLimits(context_tokens=1_000, max_bytes_per_token=1.0)  # one byte, one token: easy to count


def create(**fields: Any) -> ResponseCreate:
    return ResponseCreate.model_validate_json(json.dumps({"model": "m", "input": "hi", **fields}))


def said(text: str, suffix: str = "1") -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{suffix}", status="completed", content=[ResponseOutputText(text=text)])


def roles_and_texts(request: ResponseCreate, items) -> list[tuple[str, str | None]]:
    return [(m.role, m.text or None) for m in to_chat_request(request, items).messages]


def test_a_chain_becomes_each_responses_input_then_output_oldest_first_without_earlier_instructions():
    # GIVEN two stored turns (the first with its own instructions) and a new request with other instructions
    first = Turn(create(input="my name is Ada", instructions="be terse"), [said("noted")])
    second = Turn(create(input="what is my name?"), [said("Ada")])
    request = create(input="spell it", instructions="be kind")
    # WHEN the conversation it runs is built
    items = [*history([first, second]), *request.items()]
    # THEN the new instructions come first, then the turns in order, each input before its output, then the input;
    # the first turn's instructions are not carried over
    assert roles_and_texts(request, items) == [
        ("system", "be kind"),
        ("user", "my name is Ada"),
        ("assistant", "noted"),
        ("user", "what is my name?"),
        ("assistant", "Ada"),
        ("user", "spell it"),
    ]


def test_a_responses_function_calls_and_refusal_become_input_items_the_next_turn_can_answer():
    # GIVEN a stored output: a message with a refusal part, then two function calls
    output = [
        ResponseOutputMessage(
            id="msg_1", status="completed", content=[ResponseOutputText(text="no"), ResponseOutputRefusal(refusal="x")]
        ),
        ResponseFunctionToolCall(id="fc_1_0", call_id="call_a", name="weather", arguments='{"city":"Oslo"}'),
        ResponseFunctionToolCall(id="fc_1_1", call_id="call_b", name="time", arguments="{}"),
    ]
    # WHEN they become input items, followed by the caller's outputs of both calls
    items = [
        *output_as_input(output),
        FunctionCallOutputItem(type="function_call_output", call_id="call_a", output="rain"),
        FunctionCallOutputItem(type="function_call_output", call_id="call_b", output="noon"),
    ]
    messages = [m.model_dump(exclude_none=True) for m in to_chat_request(create(), items).messages]
    # THEN the message is an assistant turn (text and refusal), the calls one assistant message's tool_calls with
    # their ids, and each output a tool message answering its call
    assert messages[0] == {"role": "assistant", "content": "nox"}
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["call_a", "call_b"]
    assert [(m["role"], m["tool_call_id"]) for m in messages[2:]] == [("tool", "call_a"), ("tool", "call_b")]
    assert isinstance(items[1], FunctionCallItem) and items[1].id == "fc_1_0"


def test_auto_truncation_drops_the_fewest_oldest_items_that_make_the_prompt_fit():
    # GIVEN a conversation of ten 100-byte turns and a new input, with 256 output tokens of a 1,000-token context
    turns = [Turn(create(input=f"{i}" * 100), [said("a" * 100, str(i))]) for i in range(5)]
    request = create(input="b" * 100, truncation="auto", instructions="sys")
    items = [*history(turns), *request.items()]
    assert not fits(request, items, LIMITS)
    # WHEN truncation "auto" applies
    kept = truncated(request, items, LIMITS)
    # THEN the newest items are kept, as many as fit: one more would not fit
    assert kept == items[-len(kept) :] and kept[-1].text == "b" * 100
    assert fits(request, kept, LIMITS) and not fits(request, items[-len(kept) - 1 :], LIMITS)
    assert roles_and_texts(request, kept)[0] == ("system", "sys")  # the instructions are never dropped


def test_disabled_truncation_keeps_the_whole_conversation_even_over_the_context():
    turns = [Turn(create(input="x" * 900), [said("y")])]
    request = create(input="z")
    items = [*history(turns), *request.items()]
    assert truncated(request, items, LIMITS) == items


def test_auto_truncation_never_leaves_a_function_output_without_its_call():
    # GIVEN a conversation whose oldest items are a function call with long arguments and its output
    request = create(input="next", truncation="auto")
    items = [
        FunctionCallItem(type="function_call", call_id="c", name="f", arguments="[" + "1," * 350 + "1]"),
        FunctionCallOutputItem(type="function_call_output", call_id="c", output="r" * 100),
        *request.items(),
    ]
    # WHEN the context holds the output and the input but not the call
    limits = RequestLimits(context_tokens=256 + 110, max_bytes_per_token=1.0)
    kept = truncated(request, items, limits)
    # THEN the output goes with its call: only the new input is left
    assert kept == items[-1:]


def test_auto_truncation_fits_the_chat_requests_message_limit():
    # GIVEN more short turns than a chat request may carry messages
    turns = [Turn(create(input="q"), [said("a", str(i))]) for i in range(settings.MAX_MESSAGES)]
    request = create(input="last", truncation="auto")
    items = [*history(turns), *request.items()]
    # WHEN truncation "auto" applies THEN the newest items that fit the message limit are kept
    kept = truncated(request, items, RequestLimits())
    assert len(to_chat_request(request, kept).messages) == settings.MAX_MESSAGES and kept[-1].text == "last"


class EndlessChain(ResponseService):
    """A ResponseService over a chain of stored responses that never ends (no AWS): each continues one before it."""

    def __init__(self) -> None:
        self.models = SimpleNamespace(limits_of=lambda tenant: RequestLimits())  # type: ignore[assignment]
        self.read: list[str] = []

    def _turn(self, tenant: str, response_id: str, continued_by: str | None) -> Turn:
        self.read.append(response_id)
        return Turn(create(input="q", previous_response_id=f"resp_{len(self.read):032x}"), [said("a")])


def test_a_chain_longer_than_the_bound_is_a_400_naming_previous_response_id():
    # GIVEN a chain of stored responses longer than MAX_CHAIN WHEN a response continues it without truncation
    chain = EndlessChain()
    with pytest.raises(ServiceError) as caught:
        chain._conversation("t", create(previous_response_id="resp_" + "0" * 32))
    # THEN it is a 400 naming previous_response_id, after reading no more than MAX_CHAIN responses
    assert caught.value.kind is ErrorKind.INVALID and caught.value.details[0]["field"] == "previous_response_id"
    assert len(chain.read) == MAX_CHAIN


def test_with_auto_truncation_a_chain_past_the_bound_runs_its_newest_responses():
    # GIVEN the same chain WHEN a response continues it with truncation "auto"
    chain = EndlessChain()
    items = chain._conversation("t", create(input="last", previous_response_id="resp_" + "0" * 32, truncation="auto"))
    # THEN the MAX_CHAIN newest responses' input and output are run, then the input
    assert len(chain.read) == MAX_CHAIN and len(items) == 2 * MAX_CHAIN + 1 and items[-1].text == "last"
