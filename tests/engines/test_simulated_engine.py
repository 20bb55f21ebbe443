"""The simulated engine: a known throughput ceiling, slots, deterministic output, abort."""

from __future__ import annotations

import asyncio
import time

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import GenerationAborted
from gpu_worker.engines.simulated import SimulatedEngine


def chat(text: str, **kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="sim", messages=[{"role": "user", "content": text}], **kw)


async def _with_engine(engine: SimulatedEngine, body):
    await engine.start()
    try:
        return await body(engine)
    finally:
        await engine.close()


def test_throughput_stays_under_the_ceiling_with_every_slot_busy(run):
    # GIVEN 4 slots of 10 ms steps (ceiling 400 tokens/s) and 16 requests of 10 tokens each
    engine = SimulatedEngine(capacity=4, step_s=0.01, output_tokens=10)

    async def body(e):
        started = time.monotonic()
        results = await asyncio.gather(*(e.generate(f"r{i}", chat("x", max_tokens=50)) for i in range(16)))
        return results, time.monotonic() - started

    # WHEN they all run at once
    results, elapsed = run(_with_engine(engine, body))

    # THEN 160 tokens took 4 waves x 10 steps, every slot busy in every step, and no faster than the ceiling allows
    assert sum(r.completion_tokens for r in results) == 160
    assert engine.stats.steps == 40
    assert engine.stats.utilisation == 1.0
    assert engine.stats.ceiling_tokens_per_s == 400
    assert elapsed >= 40 * 0.01 * 0.99
    assert 160 / elapsed <= engine.stats.ceiling_tokens_per_s


def test_a_request_beyond_capacity_waits_for_a_free_slot(run):
    # GIVEN one slot
    engine = SimulatedEngine(capacity=1, step_s=0.005, output_tokens=5)
    finished: list[str] = []

    async def one(e, name):
        await e.generate(name, chat("x", max_tokens=50))
        finished.append(name)

    # WHEN two requests arrive together
    run(_with_engine(engine, lambda e: asyncio.gather(one(e, "first"), one(e, "second"))))

    # THEN the second ran after the first, one slot-step per step
    assert finished == ["first", "second"]
    assert engine.stats.steps == 10
    assert engine.stats.max_waiting == 2


def test_half_empty_engine_reports_half_utilisation(run):
    # GIVEN 4 slots and only 2 requests
    engine = SimulatedEngine(capacity=4, step_s=0.001, output_tokens=3)

    # WHEN they run
    run(_with_engine(engine, lambda e: asyncio.gather(*(e.generate(f"r{i}", chat("x")) for i in range(2)))))

    # THEN half the slot-steps were busy
    assert engine.stats.utilisation == 0.5


def test_output_is_the_last_user_message_cut_to_max_tokens(run):
    # GIVEN the default output length: the words of the last user message
    engine = SimulatedEngine(capacity=2, step_s=0.001)

    # WHEN one request fits and one is cut by max_tokens
    full, cut = run(
        _with_engine(
            engine,
            lambda e: asyncio.gather(
                e.generate("a", chat("one two three", max_tokens=10)),
                e.generate("b", chat("one two three", max_tokens=2)),
            ),
        )
    )

    # THEN the text is the words, one per token, with vLLM's finish reasons
    assert (full.text, full.finish_reason, full.completion_tokens) == ("one two three", "stop", 3)
    assert (cut.text, cut.finish_reason, cut.completion_tokens) == ("one two", "length", 2)
    assert full.prompt_tokens == 3


def test_stop_sequence_is_cut_from_the_text(run):
    engine = SimulatedEngine(capacity=1, step_s=0.001)

    # WHEN the text contains a stop sequence
    result = run(_with_engine(engine, lambda e: e.generate("a", chat("alpha beta gamma", stop=[" gamma"]))))

    # THEN the text ends before it and the reason is stop
    assert (result.text, result.finish_reason) == ("alpha beta", "stop")


def test_abort_of_a_running_request_raises_and_frees_its_slot(run):
    # GIVEN one slot held by a long request and a second request waiting
    engine = SimulatedEngine(capacity=1, step_s=0.001, output_tokens=4000)

    async def body(e):
        long = asyncio.create_task(e.generate("long", chat("x", max_tokens=4000)))
        short = asyncio.create_task(e.generate("short", chat("x", max_tokens=3)))
        await asyncio.sleep(0.02)
        # WHEN the running one is aborted
        await e.abort("long")
        return await asyncio.gather(long, short, return_exceptions=True)

    long_result, short_result = run(asyncio.wait_for(_with_engine(engine, body), 5))

    # THEN it raises GenerationAborted and the waiting one gets the slot and finishes
    assert isinstance(long_result, GenerationAborted)
    assert short_result.completion_tokens == 3
    assert engine.stats.aborted == 1


def test_abort_of_a_waiting_request_raises_before_it_runs(run):
    engine = SimulatedEngine(capacity=1, step_s=0.001, output_tokens=20)

    async def body(e):
        first = asyncio.create_task(e.generate("first", chat("x", max_tokens=20)))
        waiting = asyncio.create_task(e.generate("waiting", chat("x", max_tokens=20)))
        await asyncio.sleep(0)
        await e.abort("waiting")
        return await asyncio.gather(first, waiting, return_exceptions=True)

    first, waiting = run(_with_engine(engine, body))

    assert isinstance(waiting, GenerationAborted)
    assert first.completion_tokens == 20
    assert engine.stats.tokens == 20  # the aborted one never took a step


def test_abort_of_an_unknown_request_is_ignored(run):
    engine = SimulatedEngine()
    run(_with_engine(engine, lambda e: e.abort("nope")))
    assert engine.stats.aborted == 0


def test_a_cancelled_caller_frees_its_slot(run):
    # GIVEN one slot held by a request whose caller gives up (a worker timeout)
    engine = SimulatedEngine(capacity=1, step_s=0.001, output_tokens=4000)

    async def body(e):
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(e.generate("slow", chat("x", max_tokens=4000)), 0.02)
        # WHEN the next request arrives THEN it runs
        return await asyncio.wait_for(e.generate("next", chat("x", max_tokens=2)), 2)

    assert run(_with_engine(engine, body)).completion_tokens == 2
