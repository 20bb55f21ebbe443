"""A Generation as OpenAI's chat.completion (gpu_worker.completions): the official SDK's types parse the body a job's
result and a batch line carry, field for field."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion as SdkChatCompletion

from gpu_worker.completions import chat_completion
from gpu_worker.engines.base import Completion, Generation, TokenLogprob, ToolCall, TopLogprob


def sdk(generation: Generation) -> SdkChatCompletion:
    body = chat_completion(generation, completion_id="chatcmpl-1", model="m").model_dump(
        mode="json", exclude={"job_id"}
    )
    return SdkChatCompletion.model_validate(json.loads(json.dumps(body)))


def test_choices_with_text_tool_calls_and_logprobs_parse_as_the_sdks_types():
    # GIVEN two choices: one text with logprobs, one that called a tool
    hi = TokenLogprob("Hi", -0.25, [72, 105], (TopLogprob("Hi", -0.25, [72, 105]), TopLogprob("Yo", -1.5, None)))
    generation = Generation(
        choices=(
            Completion("Hi", "stop", logprobs=(hi,)),
            Completion(None, "tool_calls", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
        ),
        prompt_tokens=10,
        completion_tokens=9,
        system_fingerprint="fp",
    )
    # WHEN built and parsed by the official SDK
    completion = sdk(generation)
    text, tool = completion.choices
    # THEN every field is where OpenAI puts it
    assert (completion.object, completion.system_fingerprint, completion.usage.total_tokens) == (
        "chat.completion",
        "fp",
        19,
    )
    assert (text.index, text.message.content, text.message.refusal, text.finish_reason) == (0, "Hi", None, "stop")
    assert text.logprobs.content[0].top_logprobs[1].token == "Yo" and text.message.tool_calls is None
    assert (tool.index, tool.message.content, tool.finish_reason, tool.logprobs) == (1, None, "tool_calls", None)
    call = tool.message.tool_calls[0]
    assert (call.id, call.type, call.function.name, json.loads(call.function.arguments)) == (
        "call_1",
        "function",
        "get_weather",
        {"city": "Paris"},
    )


def test_a_legacy_function_call_is_the_messages_function_call():
    generation = Generation((Completion(None, "function_call", tool_calls=(ToolCall("call_2", "f", "{}"),)),), 1, 1)
    choice = sdk(generation).choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert (choice.message.function_call.name, choice.message.function_call.arguments) == ("f", "{}")


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_a_plain_text_choice_is_as_before(reason):
    choice = sdk(Generation.single("Paris.", reason, 5, 2)).choices[0]
    assert (choice.message.content, choice.finish_reason, choice.logprobs) == ("Paris.", reason, None)
