"""The production engine: vLLM's async engine, one per process, driven through vLLM's own OpenAI layer.

Each job's request goes to the serving object that ``vllm run-batch`` and ``vllm serve`` hand a chat.completions
body to (``OpenAIServingChat.create_chat_completion``), built once at start by vLLM's own ``init_app_state`` from
run-batch's command-line defaults plus this engine's options. So the chat template (with tools), the tool-call parser,
structured outputs (``response_format``, forced ``tool_choice``), logprobs, ``n``, penalties, ``logit_bias`` and the
rest of the sampling parameters are vLLM's, exactly as its server honours them; the adapter only translates:

- in: the job's request (``async_inference.schemas.ChatCompletionRequest``, OpenAI's body) becomes vLLM's
  ``ChatCompletionRequest``, with the served model name, the job id as ``request_id`` (vLLM's request is then
  ``chatcmpl-<job id>``), ``tool_choice`` made explicit (OpenAI's default: ``auto`` when tools are given) and the
  legacy ``functions`` / ``function_call`` as ``tools`` / ``tool_choice`` (vLLM has no legacy path); for a model
  whose chat template takes no ``tools`` (SmolLM2's), the messages are written out as the CPU engine writes them
  (``gpu_worker.engines.asks.plain_messages``: the tools in a system turn, calls and results as hermes-style text),
  or vLLM would render a prompt without the tools and the model would call functions it was never shown;
- out: vLLM's ``ChatCompletionResponse`` becomes a ``Generation``; a choice that carries tool calls has
  finish_reason ``tool_calls`` (``function_call`` for a legacy request), whichever way the call was forced.

The tool parser is the deployed model's (``TOOL_CALL_PARSER``, e.g. ``hermes`` for Qwen2.5; the task definition sets
it); without one, tool_choice ``auto`` is refused by vLLM with a 400, forced choices work (they are structured
outputs). vLLM is imported only in ``start`` (or by the caller who passes ``vllm_module``), so this module imports
on machines without it.

Progress: the serving layer asks the engine for the final output only (it does not stream); the engine client it is
given (``_CountingClient``) asks for cumulative outputs instead, of which the serving layer keeps the last, the same
final output, and counts each request's tokens as they come (``tokens_so_far``) and keeps its text so far
(``texts_so_far``, for streamed jobs). With ``n`` > 1 the final output
alone is asked for (vLLM gathers the n sequences into it) and the progress is not known until the end.

Abort: the request's task is cancelled, as vLLM's server does when a client goes away; vLLM's engine client aborts the
engine request on that cancellation.

Errors are classified by type (the classes vLLM and torch define, and Python's own): a request vLLM refuses (its
``VLLMClientError``, a ``ValueError`` or ``TypeError`` as its server maps them, or an error response with a 4xx code)
is permanent; a failed generate step (``EngineGenerateError``, any ``VLLMServerError``), out of memory, a
``RuntimeError`` or a 5xx error response is transient, so the job is retried. A dead engine is fatal: vLLM's
``EngineDeadError`` (the EngineCore process died, e.g. on a CUDA fault, and every request after it fails at once),
torch's ``AcceleratorError`` or a ``RuntimeError("CUDA error ...")`` (the CUDA context is unusable after one), or any
error while the engine reports itself ``errored`` (vLLM's own API server shuts down on exactly these). The worker
then stops and hands its jobs back for a fresh process.

The options, the engine's start and close and that classification are shared with the embedding engine
(``gpu_worker.engines.vllm_common``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import asks_of, plain_messages
from gpu_worker.engines.base import (
    Completion,
    FatalEngineError,
    Generation,
    GenerationAborted,
    PermanentEngineError,
    PromptTooLongError,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    TransientEngineError,
)
from gpu_worker.engines.common import check_prompt_chars, longest_token_chars
from gpu_worker.engines.vllm_common import VllmBase, VllmOptions

logger = logging.getLogger(__name__)

# vLLM's own options that this service sets, as `vllm run-batch` flags (before the engine's options):
# - arguments of a forced tool call validate against the function's parameters, whatever the tool's `strict` says
#   (vLLM's default, `auto`, pins the call's envelope only, and a model then writes any arguments);
# - structured outputs are compact JSON, as on the CPU engine: free whitespace between tokens lets a small model
#   indent until max_tokens cuts the object.
VLLM_ARGS = [
    "--tool-strict-level",
    "parameter",
    "--structured-outputs-config.backend",
    "xgrammar",
    "--structured-outputs-config.disable_any_whitespace",
    "true",
]


def _refusal(message: str) -> PermanentEngineError:
    """A request vLLM refused; one too long for the context is a ``PromptTooLongError``, as the other engines say."""
    return PromptTooLongError(message) if "maximum context length" in message else PermanentEngineError(message)


class _CountingClient:
    """vLLM's engine client as the serving layer is given it: the same client, except that ``generate`` counts each
    request's completion tokens as they come (see the module docstring)."""

    def __init__(
        self, client: Any, counts: dict[str, int], output_kind: Any, texts: dict[str, tuple[str, ...]] | None = None
    ) -> None:
        self._client, self._counts, self._output_kind = client, counts, output_kind
        self._texts = texts if texts is not None else {}  # vLLM request id -> its text so far (gpu_worker.deltas)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        counted = self._output_kind is not None and getattr(sampling_params, "n", 1) == 1
        if counted:
            sampling_params.output_kind = self._output_kind.CUMULATIVE
        async for output in self._client.generate(prompt, sampling_params, request_id, *args, **kwargs):
            if counted and request_id in self._counts:
                self._counts[request_id] = sum(len(o.token_ids) for o in output.outputs)
                self._texts[request_id] = tuple(o.text for o in output.outputs)
            yield output


class VllmEngine(VllmBase):
    name = "vllm"

    def __init__(self, *, seed: int | None = None, tool_call_parser: str | None = None, **options: Any) -> None:
        """``seed`` is vLLM's ``--seed``. ``tool_call_parser`` is vLLM's ``--tool-call-parser`` (it also turns on
        ``--enable-auto-tool-choice``). The other options are every vLLM engine's (``VllmOptions``): ``engine_kwargs``
        are set on vLLM's arguments as they are (any option ``vllm run-batch`` takes, by its attribute name),
        ``vllm_module`` replaces ``import vllm`` (tests pass a fake)."""
        super().__init__(VllmOptions(**options), seed=seed)
        self._tool_call_parser = tool_call_parser
        self._chat: Any = None  # vLLM's OpenAIServingChat
        self._request_model: Any = None  # vLLM's ChatCompletionRequest
        self._running: dict[str, int] = {}  # vLLM request id -> completion tokens so far
        self._texts: dict[str, tuple[str, ...]] = {}  # vLLM request id -> each choice's text so far
        self._tasks: dict[str, asyncio.Task[Any]] = {}  # job id -> its create_chat_completion
        self._aborted: set[str] = set()
        self._template_takes_tools = True  # read from the model's chat template at start
        self._longest_token_chars: int | None = None  # read from the tokenizer at start; None: vLLM's check only

    # -- lifecycle --

    async def start(self) -> None:
        """Build the engine (vLLM loads the weights and profiles memory: tens of seconds) and its OpenAI layer.

        Built in the event loop's thread, as vLLM's own OpenAI server does: the engine's client binds its output
        handler and ZeroMQ sockets to the running loop."""
        if self._engine is not None:
            return
        self._load_vllm()
        started = time.monotonic()
        self._engine, self._chat, self._request_model = await self._open()
        self._max_model_len, self._max_num_seqs = await self._engine_limits()
        logger.info(
            "vllm engine: %s ready in %.1f s (max_num_seqs=%d, max_model_len=%d, tool parser %s)",
            self._model,
            time.monotonic() - started,
            self._max_num_seqs,
            self._max_model_len,
            self._tool_call_parser,
        )

    async def _open(self) -> tuple[Any, Any, type]:
        """The engine client, the chat serving object and vLLM's request model, made as ``vllm run-batch`` makes
        them: its argument parser's defaults, this engine's options set on them, ``init_app_state`` over the engine
        client (seen through ``_CountingClient``)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmRequest

        args = self._run_batch_args(*VLLM_ARGS)
        args.tool_call_parser = self._tool_call_parser
        args.enable_auto_tool_choice = self._tool_call_parser is not None
        engine = self._new_engine(args)
        state = await self._app_state(self.counting_client(engine), args)
        self._template_takes_tools = self._chat_template_takes_tools(engine, state.openai_serving_chat)
        self._longest_token_chars = self._read_longest_token_chars(engine)
        return engine, state.openai_serving_chat, VllmRequest

    @staticmethod
    def _chat_template_takes_tools(engine: Any, chat: Any) -> bool:
        """Whether the chat template vLLM renders a request with tools by (``--chat-template``, else the model's, as
        vLLM's ``resolve_chat_template`` picks it) uses ``tools``; the test ``chat_prompt_ids`` makes for the CPU
        engine. A template that cannot be read is taken to take them (vLLM's own rendering is left alone)."""
        from vllm.renderers.hf import resolve_chat_template

        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        try:
            template = resolve_chat_template(
                engine.renderer.get_tokenizer(), chat.chat_template, [tool], model_config=engine.model_config
            )
        except Exception:  # any failure to read it: keep vLLM's rendering
            logger.warning("could not read the chat template; tools go to it as they are", exc_info=True)
            return True
        takes = template is None or "tools" in template
        if not takes:
            logger.info("the chat template takes no tools: they are written into the messages as the CPU engine does")
        return takes

    @staticmethod
    def _read_longest_token_chars(engine: Any) -> int | None:
        """The most characters a token of the served tokenizer stands for, for the length check made before vLLM
        templates and tokenises a prompt (``gpu_worker.engines.common.check_prompt_chars``); None when the tokenizer
        cannot be read (vLLM's own check, after tokenising, still refuses a prompt that does not fit)."""
        try:
            return longest_token_chars(engine.renderer.get_tokenizer())
        except Exception:
            logger.warning("could not read the tokenizer's tokens; prompts are checked by vLLM alone", exc_info=True)
            return None

    def counting_client(self, engine: Any) -> _CountingClient:
        return _CountingClient(engine, self._running, self._output_kind(), self._texts)

    def _output_kind(self) -> Any:
        return getattr(getattr(self._vllm, "sampling_params", None), "RequestOutputKind", None)

    async def _engine_limits(self) -> tuple[int, int]:
        """What the engine settled on: the model's context length when none was asked, and its batch size."""
        vllm_config = getattr(self._engine, "vllm_config", None)
        model_config = getattr(self._engine, "model_config", None) or getattr(vllm_config, "model_config", None)
        max_model_len = getattr(model_config, "max_model_len", None) or self._max_model_len
        if max_model_len is None:
            raise PermanentEngineError("could not read max_model_len from the vLLM engine; set MAX_MODEL_LEN")
        scheduler = getattr(vllm_config, "scheduler_config", None)
        max_num_seqs = getattr(scheduler, "max_num_seqs", None) or self._max_num_seqs
        return int(max_model_len), int(max_num_seqs)

    # -- requests --

    def vllm_body(self, request_id: str, request: ChatCompletionRequest) -> dict[str, Any]:
        """The body vLLM's ``ChatCompletionRequest`` is made from (see the module docstring)."""
        asks = asks_of(request)
        body = request.model_dump(mode="json", exclude_none=True)
        body.pop("functions", None)
        body.pop("function_call", None)
        # A streamed job streams through the worker's event log (gpu_worker/deltas.py): vLLM answers it whole.
        body.pop("stream", None)
        body.pop("stream_options", None)
        body.update(model=self._served_name, request_id=request_id)
        if asks.tools:
            body["tools"] = [{"type": "function", "function": f.signature()["function"]} for f in asks.tools]
            body["tool_choice"] = (
                {"type": "function", "function": {"name": asks.forced_function}}
                if asks.tool_choice == "function"
                else asks.tool_choice
            )
        else:
            body.pop("tools", None)
            body.pop("tool_choice", None)
        if not self._template_takes_tools:
            body["messages"] = plain_messages(asks)
        return body

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        if self._engine is None:
            raise TransientEngineError("the vLLM engine is not started")
        if request_id in self._tasks:
            raise PermanentEngineError(f"request {request_id!r} is already running")
        asks = asks_of(request)
        if self._longest_token_chars is not None:
            check_prompt_chars(asks, longest_token_chars=self._longest_token_chars, max_model_len=self.max_model_len)
        legacy = asks.legacy_functions
        try:
            vllm_request = self._request_model.model_validate(self.vllm_body(request_id, request))
        except ValueError as exc:  # pydantic's ValidationError: a request vLLM's schema refuses
            raise PermanentEngineError(f"vLLM refused the request: {exc}") from exc
        vllm_id = f"chatcmpl-{request_id}"
        self._running[vllm_id] = 0
        task = asyncio.ensure_future(self._chat.create_chat_completion(vllm_request))
        self._tasks[request_id] = task
        try:
            response = await task
        except asyncio.CancelledError:
            if request_id in self._aborted:
                raise GenerationAborted(request_id) from None
            task.cancel()  # our caller was cancelled (a timeout in the worker): the request must not run on
            raise
        except Exception as exc:
            if request_id in self._aborted:
                raise GenerationAborted(request_id) from exc
            raise self._failure(exc, _refusal) from exc
        finally:
            self._running.pop(vllm_id, None)
            self._texts.pop(vllm_id, None)
            self._tasks.pop(request_id, None)
            aborted = request_id in self._aborted
            self._aborted.discard(request_id)
        if aborted:
            raise GenerationAborted(request_id)
        return self._generation(request_id, response, legacy)

    def _generation(self, request_id: str, response: Any, legacy: bool) -> Generation:
        error = getattr(response, "error", None)
        if error is not None:  # vLLM's ErrorResponse
            message = f"vLLM refused the request ({error.code} {error.type}): {error.message}"
            if getattr(self._engine, "errored", False) is True:
                raise FatalEngineError(f"the vLLM engine is dead: {message}")
            if int(error.code) >= 500:
                raise TransientEngineError(message)
            raise _refusal(message)
        choices = []
        for choice in response.choices:
            if choice.finish_reason not in ("stop", "length", "tool_calls"):
                # abort, error: the engine ended it without a result; the job may succeed again
                raise TransientEngineError(
                    f"vLLM ended request {request_id} without a result (finish_reason={choice.finish_reason!r})"
                )
            choices.append(self._completion(choice, legacy))
        return Generation(
            choices=tuple(choices),
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens or 0,
            system_fingerprint=getattr(response, "system_fingerprint", None),
        )

    @staticmethod
    def _completion(choice: Any, legacy: bool) -> Completion:
        message = choice.message
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in message.tool_calls or ()
        )
        finish = choice.finish_reason
        if calls and finish != "length":
            finish = "function_call" if legacy else "tool_calls"
        logprobs = None
        if choice.logprobs is not None and choice.logprobs.content is not None:
            logprobs = tuple(
                TokenLogprob(
                    t.token, t.logprob, t.bytes, tuple(TopLogprob(a.token, a.logprob, a.bytes) for a in t.top_logprobs)
                )
                for t in choice.logprobs.content
            )
        return Completion(
            text=message.content,
            finish_reason=finish,
            tool_calls=calls,
            logprobs=logprobs,
            refusal=getattr(message, "refusal", None),
        )

    def tokens_so_far(self, request_id: str) -> int | None:
        return self._running.get(f"chatcmpl-{request_id}")

    def texts_so_far(self, request_id: str) -> tuple[str, ...] | None:
        # vLLM's detokenizer holds back what could still become a stop string, so its text so far never takes back
        return self._texts.get(f"chatcmpl-{request_id}")

    async def abort(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is None:
            return
        self._aborted.add(request_id)
        task.cancel()  # vLLM's engine client aborts the engine request when its generate is cancelled
