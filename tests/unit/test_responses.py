"""Background responses: a Responses body converts to the chat request its job runs, and the job with its
chat.completion converts to a Response the official SDK's own types validate."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import openai.types.responses as sdk
import pytest
from pydantic import ValidationError

from async_inference import settings
from async_inference.endpoints import RESPONSES_ENDPOINT, parse_line_body
from async_inference.jobs import JobStatus
from async_inference.responses import (
    ResponseRun,
    input_items,
    job_id_of,
    response_id_of,
    to_chat_request,
    to_response,
)
from async_inference.schemas import ChatCompletion, Job, Usage, error_location
from async_inference.schemas.responses import ResponseCreate

JOB_ID = "job_" + "ab" * 16
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)


def create(**fields: Any) -> ResponseCreate:
    return ResponseCreate.model_validate_json(json.dumps({"model": "m", "input": "hi", "background": True, **fields}))


def job(status: JobStatus = JobStatus.SUCCEEDED, **fields: Any) -> Job:
    return Job(
        job_id=JOB_ID,
        tenant="t",
        status=status,
        created_at=NOW,
        updated_at=NOW,
        request_bucket="b",
        request_key="k",
        deadline=NOW,
        timeout_s=60,
        finished_at=NOW + dt.timedelta(seconds=3),
        **fields,
    )


def completion(message: dict[str, Any], finish_reason: str = "stop") -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "created": 0,
            "model": "m",
            "job_id": JOB_ID,
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }
    )


def as_sdk(response) -> sdk.Response:
    """The Response as the official SDK's own pydantic type validates it (stricter than the SDK's parse)."""
    return sdk.Response.model_validate(json.loads(response.model_dump_json()))


def refusal(fields: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        ResponseCreate.model_validate_json(json.dumps({"model": "m", "input": "hi", "background": True, **fields}))
    error = caught.value.errors()[0]
    return error_location(error), str(error["msg"])


# --- Ids ------------------------------------------------------------------------------------------------------------


def test_a_response_id_maps_to_its_job_id_and_back():
    assert response_id_of(JOB_ID) == "resp_" + "ab" * 16
    assert job_id_of(response_id_of(JOB_ID)) == JOB_ID
    with pytest.raises(ValueError):
        job_id_of("resp_nothex")


# --- Request conversion ---------------------------------------------------------------------------------------------


def test_a_string_input_and_instructions_become_a_system_and_a_user_message():
    # GIVEN instructions, a string input and the sampling and limit parameters
    chat = to_chat_request(create(instructions="be brief", max_output_tokens=12, temperature=0.2, top_p=0.5))
    # THEN the chat request has the system message first, then the user's, and the same values
    assert [m.model_dump(exclude_none=True) for m in chat.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (12, 0.2, 0.5)


def test_without_max_output_tokens_the_job_gets_the_deployments_default():
    assert to_chat_request(create()).max_tokens == settings.DEFAULT_MAX_TOKENS


def test_a_message_list_with_function_calls_and_outputs_becomes_the_chat_history():
    # GIVEN a history: a developer message, a user turn with input_text parts, an assistant turn with output_text,
    # two function calls the model made, and their outputs
    items = [
        {"role": "developer", "content": "use tools"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "in Oslo?"}],
        },
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"},
    ]
    chat = to_chat_request(create(input=items))
    # THEN roles and texts carry over; the two calls are one assistant message's tool_calls; outputs are tool messages
    messages = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "weather in Oslo?" and messages[2]["content"] == "Checking."
    assert [c["id"] for c in messages[3]["tool_calls"]] == ["c1", "c2"]
    assert messages[3]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city":"Oslo"}'}
    assert (messages[4]["tool_call_id"], messages[4]["content"]) == ("c1", "rain")


def test_flat_function_tools_and_a_named_tool_choice_become_chat_tools():
    tool = {
        "type": "function",
        "name": "weather",
        "description": "the weather",
        "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    chat = to_chat_request(
        create(tools=[tool], tool_choice={"type": "function", "name": "weather"}, parallel_tool_calls=False)
    )
    assert chat.model_dump(exclude_none=True)["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "the weather",
                "strict": True,
                "parameters": tool["parameters"],
            },
        }
    ]
    assert chat.forced_function == "weather" and chat.parallel_tool_calls is False
    assert to_chat_request(create(tools=[tool], tool_choice="required")).tool_mode == "required"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {"format": {"type": "json_schema", "name": "city", "strict": True, "schema": {"type": "object"}}},
            {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": {"type": "object"}}},
        ),
        ({"format": {"type": "text"}}, None),
    ],
)
def test_text_format_becomes_the_response_format(text, expected):
    chat = to_chat_request(create(text=text))
    dumped = chat.response_format.model_dump(exclude_none=True, by_alias=True) if chat.response_format else None
    assert dumped == expected


def test_metadata_is_the_jobs_not_the_chat_requests():
    # The job carries it (notifications, the job view); the chat request's own metadata would do nothing.
    assert to_chat_request(create(metadata={"k": "v"})).metadata is None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"conversation": "conv_1"}, "conversation"),
        ({"store": False}, "store"),
        ({"include": ["message.output_text.logprobs"]}, "include.0"),
        ({"truncation": "middle"}, "truncation"),
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools.0"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
            "input.0.content.0",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"max_output_tokens": settings.MAX_TOKENS_LIMIT + 1}, "max_output_tokens"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(fields, field):
    # WHEN a request holds a parameter this service cannot honour THEN validation names that field
    location, message = refusal(fields)
    assert location == field, message


def test_stream_is_carried_to_the_chat_request_the_job_runs():
    # GIVEN a streamed Responses request WHEN it is converted THEN its job's chat request streams (the worker writes
    # its event log only for a request with stream true)
    assert to_chat_request(create(stream=True, stream_options={"include_obfuscation": False})).stream is True
    assert to_chat_request(create()).stream is False


@pytest.mark.parametrize("background", [None, False])
def test_a_request_without_background_is_valid_and_may_be_unstored(background):
    # WHEN a request leaves background out (or false), even with store false THEN it is a valid request: it is held
    # until its job ends (lambdas/api/openai_routes.py), and its Response says it is not a background one
    request = ResponseCreate.model_validate({"model": "m", "input": "hi", "background": background, "store": False})
    assert request.background is not True
    assert to_response(job(), request).background is False


def test_a_continuation_with_auto_truncation_is_accepted_and_echoed_by_its_response():
    # GIVEN a request that continues a stored response and lets the oldest turns be dropped
    request = create(previous_response_id="resp_" + "cd" * 16, truncation="auto")
    # WHEN its Response is made THEN the SDK's type reads both back as they were sent
    response = as_sdk(to_response(job(JobStatus.QUEUED), request))
    assert (response.previous_response_id, response.truncation) == ("resp_" + "cd" * 16, "auto")


def test_a_stored_body_validates_back_to_the_same_request():
    request = create(
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        tools=[{"type": "function", "name": "f", "parameters": None, "strict": None}],
        metadata={"a": "b"},
    )
    stored = request.model_dump_json(exclude_none=True, by_alias=True)
    assert ResponseCreate.model_validate_json(stored) == request


# --- Result conversion ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (JobStatus.QUEUED, "queued"),
        (JobStatus.RUNNING, "in_progress"),
        (JobStatus.CANCELLED, "cancelled"),
        (JobStatus.FAILED, "failed"),
        (JobStatus.EXPIRED, "failed"),
    ],
)
def test_an_unfinished_or_unsuccessful_job_is_a_response_in_openais_status(status, expected):
    response = as_sdk(to_response(job(status, error="engine fault"), create()))
    assert response.status == expected and response.output == [] and response.usage is None
    if expected == "failed":
        assert response.error.code == "server_error" and "engine fault" in response.error.message
    else:
        assert response.error is None


def test_a_batch_line_is_answered_with_the_response_of_a_job_that_succeeded_as_it_was_answered():
    # GIVEN a responses line with metadata, and the chat.completion its chat request got
    request = create(instructions="be brief", metadata={"k": "v"})
    result = completion({"content": "hello there"})
    # WHEN the batch worker answers it, with no job behind it
    line = to_response(ResponseRun.batch_line("ab" * 16, request), request, result)
    # THEN it is the Response the API gives for the job of that id, succeeded at the moment the line was answered
    moment = dt.datetime.fromtimestamp(line.created_at, dt.UTC)
    succeeded = job(metadata={"k": "v"}).model_copy(update={"created_at": moment, "finished_at": moment})
    assert line == to_response(succeeded, request, result)
    assert (line.id, line.status, line.completed_at) == ("resp_" + "ab" * 16, "completed", line.created_at)


def test_a_succeeded_job_is_a_completed_response_with_output_text_and_usage():
    # GIVEN a succeeded job and its chat.completion WHEN converted THEN the SDK's type parses a completed response
    request = create(instructions="be brief", metadata={"k": "v"}, temperature=0.3)
    response = as_sdk(to_response(job(metadata={"k": "v"}), request, completion({"content": "hello there"})))
    assert (response.id, response.object, response.status) == ("resp_" + "ab" * 16, "response", "completed")
    assert response.output_text == "hello there"
    [message] = response.output
    assert (message.type, message.role, message.status, message.content[0].type) == (
        "message",
        "assistant",
        "completed",
        "output_text",
    )
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (7, 3, 10)
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert (response.instructions, response.metadata, response.temperature, response.background) == (
        "be brief",
        {"k": "v"},
        0.3,
        True,
    )
    assert response.completed_at == int(NOW.timestamp()) + 3


def test_a_result_cut_at_the_token_limit_is_an_incomplete_response():
    response = as_sdk(to_response(job(), create(max_output_tokens=3), completion({"content": "a b c"}, "length")))
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.output_text == "a b c"
    assert response.completed_at is None and response.max_output_tokens == 3


def test_tool_calls_become_function_call_items():
    tool = {"type": "function", "name": "weather", "parameters": {"type": "object"}, "strict": True}
    result = completion(
        {
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
            ],
        },
        "tool_calls",
    )
    response = as_sdk(to_response(job(), create(tools=[tool], tool_choice="required"), result))
    [call] = response.output
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call",
        "call_1",
        "weather",
        '{"city":"Oslo"}',
    )
    assert response.tool_choice == "required" and response.tools[0].name == "weather"
    assert response.output_text == ""


def test_a_structured_output_format_is_echoed_in_text():
    text = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}}
    response = as_sdk(to_response(job(), create(text=text), completion({"content": "{}"})))
    assert response.text.format.type == "json_schema" and response.text.format.schema_ == {"type": "object"}


def test_input_items_list_the_input_with_ids_oldest_first():
    request = create(
        input=[
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"type": "function_call_output", "call_id": "c1", "output": "x", "id": "fco_mine"},
        ]
    )
    items = input_items(response_id_of(JOB_ID), request)
    page = sdk.ResponseItemList.model_validate(
        {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"], "has_more": False}
    )
    assert [i.type for i in page.data] == ["message", "message", "function_call_output"]
    assert page.data[0].content[0].text == "one" and page.data[1].content[0].type == "output_text"
    assert page.data[2].id == "fco_mine" and len({i.id for i in page.data}) == 3


def test_usage_comes_from_the_result_only():
    response = to_response(job(JobStatus.RUNNING, usage=Usage(prompt_tokens=1)), create())
    assert response.status == "in_progress" and response.usage is None


def test_include_and_reasoning_summaries_that_name_nothing_a_response_here_holds_are_accepted():
    # GIVEN include values for data no response here has (reasoning items, hosted tool results) and a reasoning
    # summary WHEN validated THEN accepted, and the chat request is the same as without them
    request = create(
        include=["reasoning.encrypted_content", "file_search_call.results"],
        reasoning={"effort": "low", "summary": "auto"},
    )
    assert to_chat_request(request) == to_chat_request(create(reasoning={"effort": "low"}))


def test_an_earlier_turns_reasoning_item_is_accepted_and_left_out_of_the_chat_request():
    # GIVEN a history with OpenAI's encrypted reasoning item between the turns WHEN converted THEN the chat request is
    # the one without it (no model here can read it), and the item is still listed as input
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}
    request = create(input=[*turns[:1], reasoning, *turns[1:]])
    assert to_chat_request(request) == to_chat_request(create(input=turns))
    assert [item["type"] for item in input_items(response_id_of(JOB_ID), request)][1] == "reasoning"


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"previous_response_id": "resp_" + "cd" * 16}, "previous_response_id"), ({"truncation": "auto"}, "truncation")],
)
def test_a_batch_line_cannot_continue_a_stored_response_nor_be_truncated(fields, field):
    # GIVEN a /v1/responses batch line that names a previous response, or asks to be truncated (a line runs without
    # the tenant's stored responses, and whole) WHEN its body is parsed THEN it is refused naming the field
    with pytest.raises(ValidationError) as caught:
        parse_line_body(RESPONSES_ENDPOINT, {"model": "m", "input": "hi", **fields})
    assert error_location(caught.value.errors()[0]) == field
