"""The grammar's budget (gpu_worker.engines.schema_budget): a schema whose compile would cost the shared engine too
much is refused before anything compiles it, naming the field and the limit. No model needed."""

from __future__ import annotations

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import asks_of
from gpu_worker.engines.base import PermanentEngineError
from gpu_worker.engines.schema_budget import (
    MAX_SCHEMA_ALTERNATIVES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_PATTERNS,
    SchemaCost,
)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def patterned(branches: int) -> dict:
    """The attack measured in issue 30: one property whose value is any of ``branches`` patterned strings."""
    return {
        "type": "object",
        "properties": {
            "v": {
                "anyOf": [{"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1}}}x{i}[0-9]+$"} for i in range(branches)]
            }
        },
        "required": ["v"],
    }


def nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def asks(**body):
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return asks_of(ChatCompletionRequest.model_validate({"model": "m", **body}))


def test_a_response_format_of_1600_patterned_alternatives_is_refused_naming_the_field_and_limit():
    # GIVEN the 90 KB schema of 1,600 patterned anyOf branches
    schema = patterned(1600)

    # WHEN it is asked as the response format, THEN it is refused before any compile, naming the field and the limit
    with pytest.raises(PermanentEngineError, match=r"^response_format: .*over this deployment's limit of \d+"):
        asks(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


def test_the_same_schema_as_a_forced_tools_parameters_is_refused_naming_the_tool_parameters():
    tools = [{"type": "function", "function": {"name": "f", "parameters": patterned(1600)}}]
    with pytest.raises(PermanentEngineError, match=r"^tools\[\]\.function\.parameters: "):
        asks(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}})


def test_an_ordinary_schema_is_accepted():
    got = asks(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
    assert got.json_schema == PERSON


@pytest.mark.parametrize(
    ("schema", "measure"),
    [
        (patterned(MAX_SCHEMA_PATTERNS + 1), "pattern expressions"),
        ({"type": "string", "enum": [str(i) for i in range(MAX_SCHEMA_ALTERNATIVES + 1)]}, "alternatives"),
        (nested(MAX_SCHEMA_DEPTH), "levels deep"),
    ],
)
def test_each_limit_is_checked(schema, measure):
    assert measure in (SchemaCost.of(schema).over() or "")
