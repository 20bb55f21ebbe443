"""A request's cost bounded at the API of the local stack (deployed from the template; docs/limits.md): a grammar
schema of 1,600 alternatives (in response_format or a forced tool), n x max_tokens over the cap, a caller's chat
template and an engine keyword are each a 400 naming the field and the limit; an uploaded prompt that cannot fit the
context fails its job with that reason; none of them reaches a worker."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e
KEY = next(iter(TENANT_KEYS))
# The attack of issue 30: 1,600 anyOf patterns, 90 KB, compiled for seconds while every other grammar waits.
ALTERNATIVES = {"type": "object", "properties": {"v": {"anyOf": [{"pattern": f"^a{i}b+$"} for i in range(1_600)]}}}


def submit(stack: LocalDeployment, request: dict[str, Any]) -> requests.Response:
    return requests.post(f"{stack.api_url}/v1/jobs", json={"request": request}, timeout=30, headers={"x-api-key": KEY})


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": ALTERNATIVES}}},
            "request.response_format.json_schema.schema",
            "max_schema_bytes",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": ALTERNATIVES}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "request.tools.0.function.parameters",
            "max_schema_bytes",
        ),
        ({"n": 8, "max_tokens": 4096}, "request.n", "max_request_tokens"),
    ],
)
def test_a_request_over_a_cost_limit_is_a_400_naming_the_field_and_the_limit(stack, overrides, field, says):
    # WHEN a tenant submits a request over one of the bounds on a request's cost
    response = submit(stack, chat("hi", **overrides))
    # THEN it is a 400 limit_exceeded naming the field and the limit (never accepted, never retried)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded" and error["details"][0]["field"] == field, error
    assert says in error["message"], error


def test_a_background_response_over_a_cost_limit_is_a_400_naming_its_own_field(stack):
    # WHEN a background response's text.format schema holds 1,600 alternatives
    response = requests.post(
        f"{stack.api_url}/v1/responses",
        headers={"x-api-key": KEY},
        timeout=30,
        json={
            "model": "echo-model",
            "input": "hi",
            "background": True,
            "text": {"format": {"type": "json_schema", "name": "s", "schema": ALTERNATIVES}},
        },
    )
    # THEN it is a 400 naming the Responses field and the limit
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded" and error["details"][0]["field"] == "text.format.schema", error


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        (
            {"chat_template": "{% for i in range(15000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"},
            "chat_template",
        ),
        ({"tokenize": True}, "the engine sets tokenize itself"),
    ],
)
def test_a_callers_chat_template_or_an_engine_keyword_is_a_400(stack, kwargs, says):
    # WHEN a request carries its own chat template, or tokenize: true, in chat_template_kwargs
    response = submit(stack, chat("hi", chat_template_kwargs=kwargs))
    # THEN it is a 400 at chat_template_kwargs saying what to omit
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["details"][0]["field"] == "request.chat_template_kwargs" and says in error["message"], error


def test_an_uploaded_prompt_that_cannot_fit_the_context_fails_its_job_naming_the_limit(api: Client):
    # GIVEN an upload job WHEN its uploaded prompt is 1 MB (at least 131,072 tokens for a 32,768-token context)
    created = api.submit_upload(json.dumps(chat("word " * 200_000)).encode())
    # THEN the job fails at its upload with the limit, before any worker templates it
    final = api.wait(created.job_id, timeout_s=30)
    assert final.status == "failed" and "context_length_exceeded: messages" in (final.error or ""), final
    assert "context_tokens" in final.error
