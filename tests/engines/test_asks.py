"""What a chat.completions request asks of an engine (gpu_worker.engines.asks): OpenAI's semantics read once, and the
messages written out for a chat template that knows only strings. No model needed."""

from __future__ import annotations

import json

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import asks_of, parse_tool_calls, plain_messages
from gpu_worker.engines.base import PermanentEngineError

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def asks(**body):
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return asks_of(ChatCompletionRequest.model_validate({"model": "m", **body}))


def test_tools_without_tool_choice_mean_auto_and_max_completion_tokens_is_the_limit():
    a = asks(tools=[{"type": "function", "function": WEATHER}], max_completion_tokens=33)
    assert (a.tool_choice, a.max_tokens, a.forces_tool_call, a.output_schema()) == ("auto", 33, False, None)


def test_legacy_functions_are_tools_and_a_named_function_call_forces_it():
    a = asks(functions=[WEATHER], function_call={"name": "get_weather"})
    assert (a.tool_choice, a.forced_function, a.legacy_functions) == ("function", "get_weather", True)
    assert a.output_schema() == WEATHER["parameters"]


def test_required_is_an_array_of_calls_at_most_one_without_parallel_calls():
    schema = asks(
        tools=[{"type": "function", "function": WEATHER}], tool_choice="required", parallel_tool_calls=False
    ).output_schema()
    assert (schema["type"], schema["minItems"], schema["maxItems"]) == ("array", 1, 1)
    assert schema["items"]["anyOf"][0]["properties"]["name"] == {"type": "string", "enum": ["get_weather"]}


def test_json_object_is_any_object_and_tool_choice_none_offers_no_tools():
    assert asks(response_format={"type": "json_object"}).output_schema() == {"type": "object"}
    assert asks(tools=[{"type": "function", "function": WEATHER}], tool_choice="none").tools == []


def test_a_format_and_a_forced_call_together_are_refused_naming_both():
    with pytest.raises(PermanentEngineError, match="response_format and a forced tool_choice"):
        asks(
            tools=[{"type": "function", "function": WEATHER}],
            tool_choice="required",
            response_format={"type": "json_object"},
        )


def test_messages_are_written_out_for_a_string_only_template():
    # GIVEN a conversation with a developer message, text parts, a tool call and its result, and tools offered
    a = asks(
        tools=[{"type": "function", "function": WEATHER}],
        messages=[
            {
                "role": "developer",
                "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            },
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        ],
    )
    system, user, assistant, tool = plain_messages(a)
    # THEN developer is system, parts are joined, the tools are described in it, calls and results are tagged
    assert system["role"] == "system" and system["content"].startswith("Be brief.\nBe kind.\n\n# Tools")
    assert json.dumps({"type": "function", "function": WEATHER}) in system["content"]
    assert user == {"role": "user", "content": "Weather in Paris?"}
    assert assistant == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert tool == {"role": "user", "content": "<tool_response>\n18C\n</tool_response>"}


def test_tool_calls_are_parsed_out_of_an_auto_answer():
    a = asks(tools=[{"type": "function", "function": WEATHER}])
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert parse_tool_calls(text, a) == ("Let me check.", [("get_weather", '{"city": "Paris"}')])


def test_an_answer_whose_call_does_not_parse_or_names_no_offered_function_stays_text():
    a = asks(tools=[{"type": "function", "function": WEATHER}])
    for text in (
        '<tool_call>{"name": "get_weather", "argu',
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
    ):
        assert parse_tool_calls(text, a) == (text, [])
