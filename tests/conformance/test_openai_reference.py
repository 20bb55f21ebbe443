"""The reference the conformance test holds the API to: what OpenAI would do with a chat.completions body."""

from __future__ import annotations

import pytest

from tests.conformance.openai_reference import PARAMETERS, chat_samples, classify

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_the_parameter_names_come_from_the_sdks_request_type():
    assert {"response_format", "tools", "max_completion_tokens", "top_logprobs", "stream"} <= PARAMETERS
    assert "best_of" not in PARAMETERS


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": HI},
        {"model": "m", "messages": HI, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"model": "m", "messages": HI, "tools": None, "temperature": None, "stream": False},
        {"model": "m", "messages": HI, "stream": True, "stream_options": {"include_usage": True}},  # streamed
        {"model": "m", "messages": HI, "logprobs": True, "top_logprobs": 3, "n": 2, "logit_bias": {"50256": -100}},
        {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "c", "content": "ok", "name": "f"},
            ],
        },
        {"model": "m", "messages": HI, "top_k": 20, "chat_template_kwargs": {"enable_thinking": False}},
    ],
)
def test_what_openai_takes_and_a_text_model_can_answer_is_valid(body):
    assert classify(body).kind == "valid"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
            },
            "messages.0.content.0",
        ),
        (
            {"model": "m", "messages": HI, "modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "x"}},
            "audio",
        ),
        ({"model": "m", "messages": HI, "web_search_options": {}}, "web_search_options"),
    ],
)
def test_what_a_text_only_job_cannot_do_is_out_of_scope_naming_the_field(body, field):
    verdict = classify(body)
    assert verdict.kind == "out_of_scope" and field in verdict.fields


@pytest.mark.parametrize(
    "body",
    [
        {"model": "m", "messages": HI, "best_of": 2},
        {"model": "m", "messages": HI, "temperature": 10},
        {"model": "m", "messages": HI, "stream": "True"},
        {"model": "m", "messages": HI, "logprobs": 5},
        {"model": "m", "messages": HI, "top_logprobs": 3},
        {"model": "m", "messages": HI, "tool_choice": "auto"},
        {"model": "m", "messages": HI, "logit_bias": {"foo": 1}},
        {"model": "m", "messages": HI, "response_format": {"name": "x", "schema": {}}},
        {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
        {"model": "m", "messages": []},
    ],
)
def test_what_openai_refuses_is_invalid(body):
    assert classify(body).kind == "invalid"


def test_the_corpus_has_every_kind():
    kinds = [classify(sample.body).kind for sample in chat_samples("m")]
    assert len(kinds) == 253
    assert {kind: kinds.count(kind) for kind in set(kinds)} == {"valid": 224, "out_of_scope": 19, "invalid": 10}
