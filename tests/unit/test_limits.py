"""The bounds on one request's cost (async_inference.limits): each limit refuses what is over it, names the field and
the limit, and lets what is under it through; a tenant's plan changes them; chat_template_kwargs takes only what a
model's own template reads."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from async_inference.batches.lines import BatchInputLine
from async_inference.jobs_service import describe_validation_error
from async_inference.limits import (
    LimitExceeded,
    LimitOverrides,
    RequestLimits,
    check_request,
    estimate_prompt_tokens,
    limits_for,
)
from async_inference.schemas import ChatCompletionRequest

HI = [{"role": "user", "content": "hi"}]


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": HI, **fields})


def _alternatives(count: int) -> dict[str, Any]:
    """The attack's shape: one anyOf of ``count`` string patterns."""
    return {"type": "object", "properties": {"v": {"anyOf": [{"const": f"v{i}"} for i in range(count)]}}}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def _forced_tool(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }


def _refusal(request: ChatCompletionRequest, limits: RequestLimits | None = None) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as caught:
        check_request(request, limits or RequestLimits())
    return caught.value


@pytest.mark.parametrize(
    ("schema", "limit"),
    [
        ({"type": "object", "description": "x" * 40_000}, "max_schema_bytes"),
        (_nested(20), "max_schema_depth"),
        (_alternatives(1_600), "max_schema_alternatives"),
    ],
)
def test_a_response_format_schema_over_a_limit_is_refused_naming_the_field_and_the_limit(schema, limit):
    # GIVEN a response_format json_schema over one schema limit WHEN it is checked
    refusal = _refusal(_request(response_format=_json_schema(schema)))
    # THEN the refusal names the schema's field and the limit
    assert (refusal.field, refusal.limit) == ("response_format.json_schema.schema", limit)
    assert limit in refusal.message


def test_a_forced_tools_parameters_over_a_limit_are_refused_naming_the_tool():
    # GIVEN a forced tool whose parameters hold 1,600 alternatives WHEN it is checked
    refusal = _refusal(_request(**_forced_tool(_alternatives(1_600))))
    # THEN the refusal names that tool's parameters
    assert (refusal.field, refusal.limit) == ("tools.0.function.parameters", "max_schema_alternatives")


def test_a_tool_the_model_is_not_made_to_call_is_not_compiled_so_not_bounded():
    # GIVEN the same tool, offered with tool_choice auto (no grammar) WHEN it is checked THEN it passes
    check_request(_request(tools=_forced_tool(_alternatives(1_600))["tools"]), RequestLimits())


def test_a_schema_within_every_limit_passes():
    # GIVEN a schema of 64 alternatives 10 levels deep WHEN it is checked THEN it passes
    schema = _nested(10) | {"anyOf": [{"const": i} for i in range(64)]}
    check_request(_request(response_format=_json_schema(schema)), RequestLimits())


def test_n_times_max_tokens_over_the_limit_is_refused_naming_n():
    # GIVEN n 8 of max_tokens 4096 (32,768 tokens) WHEN checked against the default 16,384
    refusal = _refusal(_request(n=8, max_tokens=4096))
    # THEN it is refused naming n and the limit, with the product
    assert (refusal.field, refusal.limit) == ("n", "max_request_tokens")
    assert "32768" in refusal.message


def test_n_times_max_tokens_at_the_limit_passes():
    check_request(_request(n=4, max_tokens=4096), RequestLimits())


def test_a_prompt_that_cannot_fit_the_context_is_refused_before_the_engine():
    # GIVEN a 300 KB prompt (at least 37,500 tokens at 8 bytes a token) for a 32,768-token context
    request = _request(messages=[{"role": "user", "content": "word " * 60_000}])
    # WHEN it is checked THEN it is refused naming the messages and the context
    refusal = _refusal(request)
    assert (refusal.field, refusal.limit) == ("messages", "context_tokens")
    assert "32768" in refusal.message


def test_the_prompt_estimate_never_exceeds_what_a_tokenizer_counts_for_ordinary_text():
    # GIVEN English text (a tokenizer gives about one token per 4 to 5 bytes of it)
    text = "The quick brown fox jumps over the lazy dog. " * 100
    # WHEN estimated THEN the estimate is at most the bytes over 8, below any real count
    assert (
        estimate_prompt_tokens(_request(messages=[{"role": "user", "content": text}]), RequestLimits())
        == (len(text) + 7) // 8
    )


def test_max_tokens_counts_against_the_context():
    # GIVEN a prompt that fits a 1,000-token context alone, and max_tokens 900 WHEN checked THEN refused
    request = _request(messages=[{"role": "user", "content": "x" * 1_600}], max_tokens=900)
    assert _refusal(request, RequestLimits(context_tokens=1_000)).limit == "context_tokens"


def test_a_tenants_plan_overrides_only_what_it_sets():
    # GIVEN a deployment's limits and a plan raising max_request_tokens
    tenant = limits_for(RequestLimits(), LimitOverrides(max_request_tokens=40_000))
    # WHEN the tenant's request asks for 32,768 tokens THEN it passes; the other limits are the deployment's
    check_request(_request(n=8, max_tokens=4096), tenant)
    assert tenant.max_schema_bytes == RequestLimits().max_schema_bytes


def test_a_batch_line_over_a_limit_is_a_validation_error_naming_the_field():
    # GIVEN a batch line asking for 8 x 4096 tokens WHEN its request is read (the worker's path)
    line = BatchInputLine.model_validate(
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": HI, "n": 8, "max_tokens": 4096},
        }
    )
    with pytest.raises(ValidationError) as caught:
        line.request()
    # THEN the error names n and the limit, as the line's 400 says it
    message, details = describe_validation_error(caught.value)
    assert details[0]["field"] == "n" and "max_request_tokens" in message


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        (
            "/v1/responses",
            {"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "s"}}},
            "text.format.schema",
        ),
        (
            "/v1/responses",
            {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required"},
            "tools.0.parameters",
        ),
        ("/v1/completions", {"model": "m", "prompt": "word " * 60_000}, "prompt"),
    ],
)
def test_a_responses_or_completions_line_over_a_limit_names_the_field_as_its_own_request_does(url, body, field):
    # GIVEN a line of another endpoint whose chat request would pass a limit (the schema: 1,600 alternatives)
    if url == "/v1/responses" and "text" in body:
        body["text"]["format"]["schema"] = _alternatives(1_600)
    elif url == "/v1/responses":
        body["tools"][0]["parameters"] = _alternatives(1_600)
    line = BatchInputLine.model_validate({"custom_id": "a", "method": "POST", "url": url, "body": body})
    # WHEN its request is read THEN the 400 names the field as that endpoint's request calls it
    with pytest.raises(ValidationError) as caught:
        line.request()
    assert describe_validation_error(caught.value)[1][0]["field"] == field


# --- chat_template_kwargs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"chat_template": "{% for i in range(15000) %}{% endfor %}"}, "chat_template: a chat template of the caller"),
        ({"tokenize": True}, "tokenize: the engine sets tokenize itself"),
        ({"add_generation_prompt": False}, "add_generation_prompt: the engine sets"),
        ({"loop": 1}, "no supported model's chat template reads 'loop'"),
        ({"enable_thinking": "x" * 65}, "at most 64 characters"),
        ({"enable_thinking": {"nested": True}}, "a boolean, a number or a string"),
    ],
)
def test_chat_template_kwargs_beyond_what_a_models_template_reads_are_refused(kwargs, says):
    # WHEN a request's chat_template_kwargs hold a template, an engine keyword or an unknown variable
    with pytest.raises(ValidationError) as caught:
        _request(chat_template_kwargs=kwargs)
    # THEN it is refused at chat_template_kwargs, saying what to fix
    error = caught.value.errors()[0]
    assert error["loc"] == ("chat_template_kwargs",) and says in error["msg"]


def test_the_variables_a_models_template_reads_are_accepted():
    request = _request(chat_template_kwargs={"enable_thinking": False, "reasoning_effort": "low"})
    assert request.chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}


# --- Errors that quote caller input ---------------------------------------------------------------------------------


def test_a_long_quote_is_clipped_to_the_limit_and_says_how_much_was_left_out():
    from async_inference.limits import MAX_ERROR_CHARS, clip

    clipped = clip("m" * 420_000)
    assert len(clipped) <= MAX_ERROR_CHARS and clipped.endswith("(419040 more characters)")
    assert clip("short") == "short"
