"""A batch input line is one pydantic model (BatchInputLine): the planner checks a file's structure with it, the
worker parses each line of a chunk with it once, and a line's body is the jobs API's request."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from pydantic import ValidationError

from async_inference.batches.lines import BatchInputLine
from async_inference.batches.planning import plan
from async_inference.schemas import ChatCompletionRequest, ChunkClaimCheck
from async_inference.served_models import ServedModels
from gpu_worker.chunks import parse_lines

SERVED = ServedModels.of(["m"])
TOOLS_BODY = {
    "model": "m",
    "messages": [{"role": "developer", "content": "Use the tool."}, {"role": "user", "content": "Paris?"}],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    "tool_choice": "required",
    "response_format": None,
    "max_completion_tokens": 20,
    "stream": False,
}


def line(custom_id: str, body: dict, **changes) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body, **changes}


def chunk(*rows: dict) -> tuple[ChunkClaimCheck, bytes]:
    data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
    claim = ChunkClaimCheck(
        batch_id="batch_1",
        tenant="t",
        bucket="b",
        input_key="k",
        chunk=0,
        start_byte=0,
        end_byte=len(data) - 1,
        first_line=1,
        line_count=len(rows),
        deadline=dt.datetime.now(dt.UTC),
        timeout_s=60,
    )
    return claim, data


def test_a_lines_body_is_the_request_the_jobs_api_would_take():
    # GIVEN a line whose body uses tools, explicit nulls and max_completion_tokens
    parsed = BatchInputLine.model_validate_json(json.dumps(line("a", TOOLS_BODY)))
    # WHEN its body is read as a request
    request = parsed.request()
    # THEN it is the request the jobs API gets for the same body
    assert request == ChatCompletionRequest.model_validate_json(json.dumps(TOOLS_BODY))
    assert (request.max_tokens, request.tool_mode) == (20, "required")


def test_the_worker_parses_each_line_once_into_its_request_or_a_400_naming_the_field():
    # GIVEN a chunk of a line the schema takes and a line with an image part (a text-only model cannot read it)
    image = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                ],
            }
        ],
    }
    claim, data = chunk(line("tools", TOOLS_BODY), line("image", image))
    # WHEN the worker parses the chunk
    tools, refused = parse_lines(claim, data, SERVED)
    # THEN the first line carries its request, the second a 400 whose param is the part at fault
    assert tools.custom_id == "tools" and tools.request is not None and tools.result is None
    assert refused.request is None and refused.result is not None
    error = refused.result.response.body["error"]
    assert refused.result.response.status_code == 400
    assert error["param"] == "messages.0.content.1"
    assert "text-only" in error["message"]


def test_planning_reports_every_structural_fault_of_a_line_by_field():
    # GIVEN a line with a wrong method, a wrong url and no body
    bad = {"custom_id": "a", "method": "PUT", "url": "/v1/completions"}
    # WHEN the file is planned
    result = plan([json.dumps(bad).encode() + b"\n"], served=SERVED)
    # THEN each fault is an error naming its field, and nothing runs
    assert sorted((e.code, e.param) for e in result.errors) == [
        ("invalid_method", "method"),
        ("invalid_url", "url"),
        ("missing_required_parameter", "body"),
    ]
    assert result.chunks == []


def test_the_url_is_checked_only_against_the_endpoint_the_context_names():
    other = line("a", TOOLS_BODY, url="/v1/embeddings")
    assert BatchInputLine.model_validate(other).url == "/v1/embeddings"
    with pytest.raises(ValidationError, match="url must be /v1/chat/completions"):
        BatchInputLine.model_validate(other, context={"endpoint": "/v1/chat/completions"})


def test_an_embeddings_lines_body_is_an_embeddings_request_and_a_token_array_a_400_naming_input():
    # GIVEN a chunk of /v1/embeddings lines: a list input, and a token array
    url = {"url": "/v1/embeddings"}
    claim, data = chunk(
        line("texts", {"model": "m", "input": ["a", "b"], "encoding_format": "base64"}, **url),
        line("tokens", {"model": "m", "input": [101, 2023, 102]}, **url),
    )

    # WHEN the worker parses it
    texts, tokens = parse_lines(claim, data, SERVED)

    # THEN the first is an embeddings request to run, the second a 400 line that names input
    assert texts.result is None and texts.request.texts == ["a", "b"]
    body = tokens.result.response.body["error"]
    assert tokens.result.response.status_code == 400 and body["param"] == "input"
    assert body["message"].startswith("the body is not a valid embeddings request: ")
    assert "token arrays are not accepted" in body["message"]


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/chat/completions", {**TOOLS_BODY, "stream": True}),
        ("/v1/completions", {"model": "m", "prompt": "Once", "stream": True}),
        ("/v1/responses", {"model": "m", "input": "hi", "stream": True}),
    ],
)
def test_a_line_that_asks_to_stream_is_refused_naming_stream(url, body):
    # GIVEN a line asking to stream (the routes stream; a line is answered in the output file)
    parsed = BatchInputLine.model_validate_json(json.dumps(line("a", body, url=url)))
    # WHEN its body is read as a request THEN the refusal names stream
    with pytest.raises(ValidationError) as caught:
        parsed.request()
    assert caught.value.errors()[0]["loc"] == ("stream",)
