"""The wire schemas validate what the API contract promises."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pydantic import ValidationError

from async_inference import settings
from async_inference.jobs_service import describe_validation_error
from async_inference.schemas import ChatCompletionRequest, ClaimCheck, JobSubmission, error_location

MESSAGES = [{"role": "user", "content": "hi"}]


def test_defaults_follow_openai_and_the_shared_settings():
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES})
    assert (request.max_tokens, request.temperature, request.top_p, request.n) == (
        settings.DEFAULT_MAX_TOKENS,
        1.0,
        1.0,
        1,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"max_tokens": "5"},
        {"max_tokens": 5.0},
        {"temperature": 2.5},
        {"top_p": 1.5},
        {"n": settings.MAX_CHOICES + 1},
        {"seed": 2**63},
        {"stop": ""},
        {"logprobs": 1},
        {"messages": [{"role": "user"}]},
        {"best_of": 2},
    ],
)
def test_invalid_or_unknown_request_fields_are_rejected(change):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate_json(
            __import__("json").dumps({"model": "m", "messages": MESSAGES, **change})
        )


def test_stop_accepts_a_string_or_a_list_and_normalises_to_a_list():
    assert ChatCompletionRequest(model="m", messages=MESSAGES, stop="\n").stop_sequences == ["\n"]
    assert ChatCompletionRequest(model="m", messages=MESSAGES, stop=["a", "b"]).stop_sequences == ["a", "b"]


def test_submission_needs_exactly_one_of_request_and_upload():
    with pytest.raises(ValidationError, match="exactly one"):
        JobSubmission.model_validate({"metadata": {}})
    with pytest.raises(ValidationError, match="exactly one"):
        JobSubmission.model_validate({"request": {"model": "m", "messages": MESSAGES}, "upload": {"size_bytes": 1}})


def test_metadata_is_bounded():
    too_many = {f"k{i}": "v" for i in range(settings.MAX_METADATA_KEYS + 1)}
    with pytest.raises(ValidationError):
        JobSubmission.model_validate({"upload": {"size_bytes": 1}, "metadata": too_many})


def test_claim_check_is_versioned_and_small():
    claim = ClaimCheck(
        job_id="job_" + "a" * 32,
        tenant="t" * 64,
        bucket="b" * 63,
        key="k" * 200,
        model="m" * 256,
        deadline=dt.datetime.now(dt.UTC),
        timeout_s=600,
    )
    body = claim.model_dump_json()
    assert '"schema_version":"1"' in body
    assert len(body.encode()) < 1024


def test_claim_check_refuses_a_malformed_job_id():
    with pytest.raises(ValidationError):
        ClaimCheck(job_id="job_x", tenant="t", bucket="b", key="k", deadline=dt.datetime.now(dt.UTC), timeout_s=1)


# --- OpenAI's chat.completions parameters --------------------------------------------------------------------------


def _request(**fields):
    return ChatCompletionRequest.model_validate_json(json.dumps({"model": "m", "messages": MESSAGES, **fields}))


def _refusal(**fields) -> tuple[str, str]:
    """The (field, message) a refused request names, as the API reports it."""
    with pytest.raises(ValidationError) as caught:
        _request(**fields)
    error = caught.value.errors()[0]
    return error_location(error), error["msg"]


def test_every_parameter_a_text_model_honours_is_accepted_with_openais_names():
    # GIVEN a body with every honoured parameter, as the openai SDK sends them
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "d", "strict": True, "parameters": parameters},
    }
    body = dict(
        max_completion_tokens=50,
        temperature=0,
        top_p=0.5,
        n=3,
        stop=["\n"],
        seed=-5,
        presence_penalty=-2,
        frequency_penalty=1.5,
        logit_bias={"50256": -100},
        logprobs=True,
        top_logprobs=20,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
        },
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        chat_template_kwargs={"enable_thinking": False},
    )
    # WHEN it is validated
    request = _request(**body)
    # THEN each is kept under its wire name, max_completion_tokens gives max_tokens, and the helpers agree
    assert (request.max_tokens, request.n, request.top_logprobs, request.top_k) == (50, 3, 20, 40)
    assert request.json_schema == {"type": "object"}
    assert (request.tool_mode, request.forced_function) == ("required", "get_weather")
    # AND the stored form (a null-free dump, by wire name) validates to the same request
    again = ChatCompletionRequest.model_validate_json(request.model_dump_json(exclude_none=True))
    assert again == request
    assert '"schema":{"type":"object"}' in request.model_dump_json(exclude_none=True)


def test_messages_take_every_role_and_shape_a_text_conversation_has():
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}], "name": "ops"},
        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "annotations": [],
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "function", "name": "legacy", "content": None},
    ]
    request = ChatCompletionRequest.model_validate_json(json.dumps({"model": "m", "messages": messages}))
    assert request.messages[1].text == "Weather in Paris?"
    template = request.template_messages()
    # developer reads as system, parts as one text, tool call arguments as an object, a function result as a tool one
    assert template[0] == {"role": "system", "content": "Be brief.", "name": "ops"}
    assert template[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert [m["role"] for m in template] == ["system", "user", "assistant", "tool", "assistant", "tool"]


def test_explicit_nulls_mean_omitted_and_stream_false_is_accepted():
    nulls = {
        name: None
        for name in (
            "max_tokens",
            "temperature",
            "top_p",
            "n",
            "stop",
            "seed",
            "tools",
            "tool_choice",
            "response_format",
            "logprobs",
            "user",
            "stream",
            "audio",
            "web_search_options",
        )
    }
    assert _request(**nulls) == _request()
    assert _request(stream=False).stream is False


def test_stream_true_is_accepted_with_its_usage_option():
    # WHEN a chat request asks to stream, with the usage in the last chunk THEN it is valid as sent
    request = _request(stream=True, stream_options={"include_usage": True})
    assert request.stream is True and request.stream_options.include_usage is True


def test_parameters_without_effect_on_a_self_hosted_text_model_are_accepted():
    _request(
        user="u",
        metadata={"k": "v"},
        store=True,
        service_tier="auto",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        safety_identifier="s",
        stream_options={"include_usage": True},
        reasoning_effort="low",
        verbosity="low",
        modalities=["text"],
        prediction={"type": "content", "content": "draft"},
    )


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "see"},
                            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                        ],
                    }
                ]
            },
            "messages.0.content.1",
            "text-only",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
                ]
            },
            "messages.0.content.0",
            "text-only",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
            "messages.0.content.0",
            "text-only",
        ),
        ({"modalities": ["text", "audio"]}, "modalities", "audio output"),
        ({"audio": {"format": "wav", "voice": "alloy"}}, "audio", "audio output"),
        ({"web_search_options": {}}, "web_search_options", "function tool"),
        ({"tools": [{"type": "web_search"}]}, "tools.0", "function tool"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools.0", "function tool"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation", "omit moderation"),
    ],
)
def test_what_a_text_only_job_cannot_do_is_refused_naming_the_field_and_what_to_do(fields, field, says):
    named, message = _refusal(**fields)
    assert named == field
    assert says in message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_tokens": 10, "max_completion_tokens": 20}, "max_completion_tokens"),
        ({"top_logprobs": 5}, "top_logprobs"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "none"}, "tool_choice"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "a"}}],
                "tool_choice": {"type": "function", "function": {"name": "b"}},
            },
            "tool_choice",
        ),
        ({"functions": [{"name": "a"}], "function_call": {"name": "b"}}, "function_call"),
        ({"logit_bias": {"foo": 1}}, "logit_bias.foo.[key]"),
        ({"logit_bias": {"1": 101}}, "logit_bias.1"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"response_format": {"name": "x", "schema": {}}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"stream": "True"}, "stream"),
        ({"usage": {"include": True}}, "usage"),
    ],
)
def test_what_openai_refuses_is_refused_naming_the_field(fields, field):
    assert _refusal(**fields)[0] == field


def test_an_unknown_parameter_is_named_and_said_to_be_unknown():
    with pytest.raises(ValidationError) as caught:
        _request(best_of=2)
    message, details = describe_validation_error(caught.value)
    assert message.startswith("best_of: unknown field")


def test_a_request_the_narrow_schema_took_keeps_its_fingerprint():
    # GIVEN a submission as the schema before the whole chat.completions request took it, and its fingerprint then
    # (main at 9165883: an Idempotency-Key retry across the deploy must match the job it made)
    submission = JobSubmission.model_validate(
        {
            "request": {
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi", "name": "bob"},
                ],
                "max_tokens": 5,
                "stop": ["x"],
            },
            "metadata": {"k": "v"},
        }
    )
    # WHEN it is fingerprinted now THEN the digest is the same
    assert submission.fingerprint() == "sha256:4130de74050e29d2a2a0ee4e291e8f7bcda49e508f3404c8059adc876ebdbe25"


def test_max_completion_tokens_and_max_tokens_fingerprint_alike():
    def fingerprint(**fields) -> str:
        return JobSubmission.model_validate({"request": {"model": "m", "messages": MESSAGES, **fields}}).fingerprint()

    assert fingerprint(max_completion_tokens=50) == fingerprint(max_tokens=50) != fingerprint(max_tokens=51)
    assert fingerprint(tools=None, presence_penalty=0) == fingerprint()


def test_every_parameter_of_openais_request_type_is_a_field_with_its_wire_name():
    # GIVEN the parameters of the official SDK's chat.completions request type
    from openai.types.chat.completion_create_params import CompletionCreateParamsBase

    sdk = set(CompletionCreateParamsBase.__annotations__) | {"stream"}
    # THEN each is a field of the request (honoured, without effect, or refused by name), none renamed
    assert sdk <= set(ChatCompletionRequest.model_fields)
    assert [name for name, info in ChatCompletionRequest.model_fields.items() if info.alias not in (None, name)] == []
    # AND the JSON Schema (the OpenAPI document's) says an optional parameter may be null, and what is refused
    properties = ChatCompletionRequest.model_json_schema()["properties"]
    assert {"type": "null"} in properties["temperature"]["anyOf"]
    assert properties["audio"]["description"].startswith("Refused (400)")


WIND = {"type": "string", "pattern": r"\b(N|S|E|W)\b"}  # the corpus's (line 115): xgrammar cannot compile \b


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "w", "schema": {"type": "object", "properties": {"wind": WIND}}},
                }
            },
            "response_format.json_schema.schema.properties.wind.pattern",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "array", "items": {"$ref": "#/$defs/w"}, "$defs": {"w": WIND}},
                        },
                    }
                ]
            },
            "tools.0.function.parameters.$defs.w.pattern",
        ),
        ({"functions": [{"name": "f", "parameters": {"anyOf": [WIND]}}]}, "functions.0.parameters.anyOf.0.pattern"),
    ],
)
def test_a_pattern_the_grammar_cannot_honour_is_refused_naming_it_and_what_to_do(fields, field):
    # GIVEN a schema whose pattern uses a word boundary, which the engines' grammar library (xgrammar) cannot compile
    # WHEN a request carries it as the response format or a function's parameters
    named, message = _refusal(**fields)
    # THEN it is refused at the door naming the pattern, saying what to write instead
    assert named == field
    assert "word boundary" in message and "match the words themselves" in message


def test_patterns_the_grammar_honours_and_non_schema_pattern_keys_are_accepted():
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": r"^[A-Z]{2}-\d{3}$"},
            "pattern": {"type": "string", "default": {"pattern": r"\b"}},  # a property named so, and a default value
        },
    }
    request = _request(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert request.json_schema == schema
