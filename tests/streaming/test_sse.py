"""The server-sent events made from log segments are OpenAI's: the official SDK's stream parser reads them into its
own typed objects, and its accumulators rebuild the whole answer from them."""

from __future__ import annotations

import json

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from async_inference.streaming import (
    DONE,
    ChoiceEnd,
    Delta,
    End,
    Segment,
    StreamInterrupted,
    ToolCallEnd,
    chat_completion_chunks,
    completion_chunks,
    response_events,
)
from tests.streaming.sdk import parse


def log_of(*texts: str, tail: str = "", finish: str = "stop", **end_fields) -> list[Segment]:
    """Segments of a run that streamed ``texts`` and ended with ``tail`` (and ``end_fields``)."""
    segments = [Segment(seq=1_000_000 + i, deltas=[Delta(text=t)]) for i, t in enumerate(texts, 1)]
    end = End(
        status="succeeded",
        choices=[ChoiceEnd(text=tail, finish_reason=finish, **end_fields)],
        prompt_tokens=7,
        completion_tokens=5,
    )
    return [*segments, Segment(seq=1_000_000 + len(texts) + 1, end=end)]


def response_object(status: str = "queued") -> dict:
    return {
        "id": "resp_abc",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "m",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


# --- chat.completions ------------------------------------------------------------------------------------------------


def test_the_sdk_parses_each_delta_as_a_chat_completion_chunk_and_stops_at_done():
    # GIVEN a run that streamed two deltas and ended with a third
    frames = list(chat_completion_chunks(log_of("Hel", "lo", tail=" you"), completion_id="chatcmpl-1", model="m"))
    # WHEN the SDK parses the stream
    chunks = parse(frames, ChatCompletionChunk)
    # THEN it gets the role chunk, one content chunk per delta, and the finish, and [DONE] is last
    assert frames[-1] == DONE
    assert [c.choices[0].delta.content for c in chunks] == ["", "Hel", "lo", " you", None]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and {c.id for c in chunks} == {"chatcmpl-1"}


def test_include_usage_puts_the_usage_in_a_last_chunk_without_choices():
    frames = chat_completion_chunks(log_of("a"), completion_id="chatcmpl-1", model="m", include_usage=True)
    chunks = parse(frames, ChatCompletionChunk)
    assert [c.usage for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens, chunks[-1].usage.total_tokens) == (
        7,
        5,
        12,
    )


def test_the_sdk_accumulates_the_chunks_into_the_whole_message_with_its_tool_calls():
    # GIVEN a run whose end carries a tool call (nothing streamed while decoding: it offered tools)
    call = ToolCallEnd(id="call_1", name="get_weather", arguments='{"city":"Paris"}')
    frames = chat_completion_chunks(log_of(finish="tool_calls", tool_calls=[call]), completion_id="c", model="m")
    # WHEN the SDK's own accumulator takes every chunk
    state = ChatCompletionStreamState()
    for chunk in parse(frames, ChatCompletionChunk):
        state.handle_chunk(chunk)
    # THEN its final completion has the call, as a non-streamed answer would
    message = state.get_final_completion().choices[0].message
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("call_1", "get_weather", '{"city":"Paris"}')
    ]
    assert state.get_final_completion().choices[0].finish_reason == "tool_calls"


def test_a_failed_run_ends_the_stream_with_an_error_the_sdk_raises():
    segments = [
        Segment(seq=1_000_001, deltas=[Delta(text="Hi")]),
        Segment(seq=1_000_002, end=End(status="failed", error="boom")),
    ]
    frames = chat_completion_chunks(segments, completion_id="c", model="m")
    with pytest.raises(openai.APIError, match="boom"):
        parse(frames, ChatCompletionChunk)


def test_an_interrupted_stream_ends_with_an_error_and_done():
    def interrupted():
        yield Segment(seq=1_000_001, deltas=[Delta(text="Hi")])
        raise StreamInterrupted("the job restarted")

    frames = list(chat_completion_chunks(interrupted(), completion_id="c", model="m"))
    assert frames[-1] == DONE
    with pytest.raises(openai.APIError, match="the job restarted"):
        parse(frames, ChatCompletionChunk)


def test_n_choices_each_get_their_role_their_text_and_their_finish():
    end = End(
        status="succeeded",
        choices=[
            ChoiceEnd(index=0, text="a", finish_reason="stop"),
            ChoiceEnd(index=1, text="b", finish_reason="length"),
        ],
    )
    segments = [Segment(seq=1_000_001, deltas=[Delta(index=1, text="x")]), Segment(seq=1_000_002, end=end)]
    state = ChatCompletionStreamState()
    for chunk in parse(chat_completion_chunks(segments, completion_id="c", model="m", n=2), ChatCompletionChunk):
        state.handle_chunk(chunk)
    choices = state.current_completion_snapshot.choices  # get_final_completion raises on "length", by design
    assert [(c.message.content, c.finish_reason) for c in choices] == [("a", "stop"), ("xb", "length")]


# --- completions -----------------------------------------------------------------------------------------------------


def test_the_sdk_parses_the_completions_stream_into_text_completion_chunks():
    frames = completion_chunks(
        log_of("Once", " upon", tail=" a"), completion_id="cmpl-1", model="m", include_usage=True
    )
    chunks = parse(frames, Completion, path="/v1/completions")
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Once upon a"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.total_tokens == 12 and {c.object for c in chunks} == {"text_completion"}


# --- Responses -------------------------------------------------------------------------------------------------------


def responses_state(frames) -> tuple[list, ResponseStreamState]:
    events = parse(frames, ResponseStreamEvent, path="/v1/responses")
    state = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for event in events:
        state.handle_event(event)
    return events, state


def test_the_sdk_parses_the_responses_events_in_order_and_completes_the_response():
    # GIVEN a run that streamed two deltas
    frames = response_events(log_of("Hel", "lo", tail="!"), response=response_object())
    # WHEN the SDK parses and accumulates the events
    events, state = responses_state(frames)
    # THEN the events are OpenAI's, numbered from 0 without a gap, and the completed response holds the whole text
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].response
    assert completed.output_text == "Hello!" and completed.status == "completed"
    assert completed.usage.input_tokens == 7 and completed.usage.output_tokens == 5
    assert completed.output[0].id == "msg_abc"  # the id GET /v1/responses/{id} gives the stored item


def test_starting_after_resumes_with_the_next_event_and_the_same_numbers():
    # GIVEN a whole stream, and a client that dropped it after event 4 (the first delta)
    whole = parse(
        response_events(log_of("Hel", "lo"), response=response_object()), ResponseStreamEvent, "/v1/responses"
    )
    # WHEN it reconnects with starting_after=4
    resumed = parse(
        response_events(log_of("Hel", "lo"), response=response_object("in_progress"), starting_after=4),
        ResponseStreamEvent,
        "/v1/responses",
    )
    # THEN it gets exactly the events after 4, numbered as before
    assert [(e.sequence_number, e.type) for e in resumed] == [(e.sequence_number, e.type) for e in whole[5:]]
    assert [e.delta for e in resumed if e.type == "response.output_text.delta"] == ["lo"]


def test_a_tool_call_becomes_a_function_call_item_with_its_arguments():
    call = ToolCallEnd(id="call_9", name="lookup", arguments='{"q":"x"}')
    events, _ = responses_state(
        response_events(log_of(finish="tool_calls", tool_calls=[call]), response=response_object())
    )
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.item.type for e in added] == ["function_call"]
    completed = events[-1].response
    assert [(o.type, o.call_id, o.name, o.arguments) for o in completed.output] == [
        ("function_call", "call_9", "lookup", '{"q":"x"}')
    ]


def test_a_cut_answer_ends_with_response_incomplete():
    events, _ = responses_state(response_events(log_of("a", finish="length"), response=response_object()))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_failed_run_ends_with_response_failed_and_its_reason():
    segments = [Segment(seq=1_000_001, end=End(status="failed", error="the prompt is too long"))]
    events, _ = responses_state(response_events(segments, response=response_object()))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.message == "the prompt is too long"


def test_a_run_failed_by_the_request_ends_the_chat_stream_with_its_code():
    # GIVEN a run that failed on the request's fault (the job's error code) WHEN streamed as chat chunks THEN the
    # error event carries that code as a client error, as the held request's 400 would (not server_error)
    end = End(status="failed", error="the prompt is longer than the context", code="context_length_exceeded")
    frames = list(chat_completion_chunks([Segment(seq=1_000_001, end=end)], completion_id="c", model="m"))
    [error] = [json.loads(f[len("data: ") :]) for f in frames if f.startswith('data: {"error"')]
    assert error["error"]["code"] == "context_length_exceeded"
    assert error["error"]["type"] == "invalid_request_error"


def test_a_run_failed_by_the_request_ends_with_response_failed_and_its_code():
    end = End(status="failed", error="the prompt is longer than the context", code="context_length_exceeded")
    events, _ = responses_state(response_events([Segment(seq=1_000_001, end=end)], response=response_object()))
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "context_length_exceeded"
