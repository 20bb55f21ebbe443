"""Batches of /v1/completions and /v1/responses lines end to end with the official ``openai`` SDK, unmodified,
against the local stack and a worker (the echo engine: the pipeline is what is checked here; the CPU engine's raw
prompt and Response are in tests/engines/test_cpu_completion_lines.py)."""

from __future__ import annotations

import json

import openai
import pytest

from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS
from tests.e2e.test_batches_openai import jsonl, settled, upload

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


def run_batch(sdk: openai.OpenAI, endpoint: str, bodies: dict[str, dict]) -> tuple[dict, dict]:
    """Upload one line per body, create the batch for ``endpoint``, wait for it; its output and error lines."""
    lines = [{"custom_id": c, "method": "POST", "url": endpoint, "body": b} for c, b in bodies.items()]
    batch = sdk.batches.create(input_file_id=upload(sdk, jsonl(lines)).id, endpoint=endpoint, completion_window="24h")
    done = settled(sdk, batch.id, "completed", "failed", timeout_s=120)
    assert done.status == "completed", done.errors

    def rows(file_id: str | None) -> dict:
        if file_id is None:
            return {}
        return {r["custom_id"]: r for r in map(json.loads, sdk.files.content(file_id).read().splitlines())}

    return rows(done.output_file_id), rows(done.error_file_id)


def test_a_batch_of_completions_lines_completes_with_text_completions(sdk, worker):
    # GIVEN completions lines (a string prompt, a one-string list) and one the service refuses (echo)
    bodies = {
        "plain": {"model": "echo-model", "prompt": "once upon a time", "max_tokens": 8},
        "listed": {"model": "echo-model", "prompt": ["in a land far away"], "max_tokens": 8, "n": 2},
        "echoed": {"model": "echo-model", "prompt": "x", "echo": True},
    }
    # WHEN the SDK runs them as a /v1/completions batch
    outputs, errors = run_batch(sdk, "/v1/completions", bodies)
    # THEN each output line is a text_completion the SDK's type parses, and the refused one a 400 naming echo
    completions = {c: openai.types.Completion.model_validate(r["response"]["body"]) for c, r in outputs.items()}
    assert sorted(completions) == ["listed", "plain"]
    assert all(c.object == "text_completion" and c.id.startswith("cmpl-") for c in completions.values())
    assert "once upon a time" in completions["plain"].choices[0].text
    assert [choice.index for choice in completions["listed"].choices] == [0, 1]
    assert completions["plain"].usage.prompt_tokens > 0
    assert errors["echoed"]["response"]["status_code"] == 400
    assert errors["echoed"]["response"]["body"]["error"]["param"] == "echo"


def test_a_batch_of_responses_lines_completes_with_responses(sdk, worker):
    # GIVEN responses lines as OpenAI's batch lines carry them (no background), and one with a hosted tool
    bodies = {
        "text": {"model": "echo-model", "input": "hello responses", "instructions": "Be brief."},
        "items": {
            "model": "echo-model",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "from items"}]}],
            "metadata": {"ticket": "42"},
        },
        "hosted": {"model": "echo-model", "input": "x", "tools": [{"type": "web_search"}]},
    }
    # WHEN the SDK runs them as a /v1/responses batch
    outputs, errors = run_batch(sdk, "/v1/responses", bodies)
    # THEN each output line is a Response the SDK's type parses, completed, with output_text and usage
    responses = {c: openai.types.responses.Response.model_validate(r["response"]["body"]) for c, r in outputs.items()}
    assert sorted(responses) == ["items", "text"]
    assert all(r.status == "completed" and r.usage.total_tokens > 0 for r in responses.values())
    assert "hello responses" in responses["text"].output_text and "from items" in responses["items"].output_text
    assert responses["items"].metadata == {"ticket": "42"} and responses["text"].instructions == "Be brief."
    assert errors["hosted"]["response"]["status_code"] == 400
    assert errors["hosted"]["response"]["body"]["error"]["param"].startswith("tools")
