"""The production engine: vLLM's async engine, one per process, fed one request per job.

vLLM batches continuously inside itself, so the adapter does no batching of its own: every ``generate`` is one vLLM
request whose id is the job id, and the worker keeps ``capacity`` (= vLLM's ``max_num_seqs``) of them in flight so
that the scheduler always has a full batch to choose from.

The prompt is built here, not by vLLM: the engine's own tokenizer renders the chat template and the token ids are
submitted (``TokensPrompt``), which lets the adapter refuse a prompt that cannot fit before it reaches the engine and
report ``prompt_tokens`` exactly. vLLM is imported only in ``start`` (or by the caller who passes ``vllm_module``), so
this module imports on machines without it.

Outputs are asked for as deltas (``RequestOutputKind.DELTA``): each ``RequestOutput`` carries the token ids and text
generated since the one before, so the adapter knows a running request's tokens so far (``tokens_so_far``, the job's
progress) without vLLM copying the whole completion at every step, as cumulative outputs would. vLLM merges the
deltas a slow consumer has not read yet into one, so a busy event loop reads fewer, larger outputs.

Errors: a request that vLLM rejects (validation) is permanent; a failed generate step (vLLM's EngineGenerateError,
"possibly recoverable") or an out-of-memory error is transient, so the job is retried. A dead engine is fatal: vLLM's
EngineDeadError (v1, "Unrecoverable": the EngineCore process died, e.g. on a CUDA fault, and every request after it
fails at once), AsyncEngineDeadError / MQEngineDeadError (the v0 engines), a CUDA error seen in this process (the
CUDA context is unusable after one), or any error while the engine reports itself ``errored`` (vLLM's own API server
shuts down on exactly these). The worker then stops and hands its jobs back for a fresh process.
"""

from __future__ import annotations

import inspect
import logging
import time
from types import ModuleType
from typing import Any

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import (
    Engine,
    Generation,
    GenerationAborted,
    FatalEngineError,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.engines.common import chat_prompt_ids, check_context

logger = logging.getLogger(__name__)

DEFAULT_MAX_NUM_SEQS = 64

# vLLM exception classes by name, so that the mapping holds across vLLM versions that moved them between modules.
# The most specific class decides: AsyncEngineDeadError is a RuntimeError, and fatal.
_FATAL_ERRORS = {"EngineDeadError", "AsyncEngineDeadError", "MQEngineDeadError", "AcceleratorError"}
_PERMANENT_ERRORS = {"VLLMValidationError", "VLLMClientError", "ValueError", "TypeError"}
_TRANSIENT_ERRORS = {"EngineGenerateError", "OutOfMemoryError", "VLLMServerError", "RuntimeError"}
# torch before AcceleratorError raised CUDA faults as RuntimeError("CUDA error: ..."); they are sticky.
_CUDA_ERROR_PREFIX = "CUDA error"


def _error_kind(exc: BaseException) -> str | None:
    for cls in type(exc).__mro__:
        if cls.__name__ in _FATAL_ERRORS:
            return "fatal"
        if cls.__name__ in _PERMANENT_ERRORS:
            return "permanent"
        if cls.__name__ in _TRANSIENT_ERRORS:
            return "fatal" if str(exc).startswith(_CUDA_ERROR_PREFIX) else "transient"
    return None


class VllmEngine(Engine):
    name = "vllm"

    def __init__(
        self,
        *,
        model: str | None = None,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_model_len: int | None = None,
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int | None = None,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        served_model_name: str | None = None,
        seed: int | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        vllm_module: ModuleType | None = None,
    ) -> None:
        """``engine_kwargs`` go to ``AsyncEngineArgs`` as they are (any option vLLM knows). ``vllm_module`` replaces
        ``import vllm`` (tests pass a fake)."""
        if not model:
            raise ValueError("the vLLM engine needs a model (env MODEL): a Hugging Face model directory or name")
        self._model = model
        self._max_num_seqs = max_num_seqs
        self._max_model_len = max_model_len
        optional = {
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "served_model_name": served_model_name,
            "seed": seed,
        }
        self._engine_kwargs = {
            "model": model,
            "max_num_seqs": max_num_seqs,
            **{k: v for k, v in optional.items() if v is not None},
            **(engine_kwargs or {}),
        }
        self._vllm = vllm_module
        self._engine: Any = None
        self._tokenizer: Any = None
        self._running: dict[str, int] = {}  # request id -> completion tokens so far
        self._aborted: set[str] = set()

    @property
    def capacity(self) -> int:
        return self._max_num_seqs

    @property
    def max_model_len(self) -> int:
        if self._max_model_len is None:
            raise RuntimeError("max_model_len is known once the engine has started")
        return self._max_model_len

    # -- lifecycle --

    async def start(self) -> None:
        """Build the engine (vLLM loads the weights and profiles memory: tens of seconds).

        Built in the event loop's thread, as vLLM's own OpenAI server does: the engine's client binds its output
        handler and ZeroMQ sockets to the running loop."""
        if self._engine is not None:
            return
        if self._vllm is None:
            try:
                import vllm
            except ImportError as exc:
                raise PermanentEngineError("ENGINE=vllm needs the vllm package (the vllm/vllm-openai image)") from exc
            self._vllm = vllm
        started = time.monotonic()
        args = self._vllm.AsyncEngineArgs(**self._engine_kwargs)
        self._engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        tokenizer = self._engine.get_tokenizer()
        self._tokenizer = await tokenizer if inspect.isawaitable(tokenizer) else tokenizer
        self._max_model_len, self._max_num_seqs = await self._engine_limits()
        logger.info(
            "vllm engine: %s ready in %.1f s (max_num_seqs=%d, max_model_len=%d)",
            self._model,
            time.monotonic() - started,
            self._max_num_seqs,
            self._max_model_len,
        )

    async def _engine_limits(self) -> tuple[int, int]:
        """What the engine settled on: the model's context length when none was asked, and its batch size."""
        vllm_config = getattr(self._engine, "vllm_config", None)
        model_config = getattr(self._engine, "model_config", None) or getattr(vllm_config, "model_config", None)
        if model_config is None and hasattr(self._engine, "get_model_config"):  # vLLM before v1
            model_config = await self._engine.get_model_config()
        max_model_len = getattr(model_config, "max_model_len", None) or self._max_model_len
        if max_model_len is None:
            raise PermanentEngineError("could not read max_model_len from the vLLM engine; set MAX_MODEL_LEN")
        scheduler = getattr(vllm_config, "scheduler_config", None)
        max_num_seqs = getattr(scheduler, "max_num_seqs", None) or self._max_num_seqs
        return int(max_model_len), int(max_num_seqs)

    async def close(self) -> None:
        if self._engine is not None:
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                result = shutdown()
                if inspect.isawaitable(result):
                    await result
            self._engine = None

    # -- requests --

    def sampling_params(self, request: ChatCompletionRequest) -> Any:
        """The request's sampling parameters in vLLM's terms (OpenAI semantics: temperature 0 is greedy)."""
        options: dict[str, Any] = {
            "n": 1,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "stop": request.stop_sequences or None,
            "seed": request.seed,
        }
        kind = self._output_kind()
        if kind is not None:  # only what is new in each output (vLLM without output kinds sends cumulative ones)
            options["output_kind"] = kind.DELTA
        return self._vllm.SamplingParams(**options)

    def _output_kind(self) -> Any:
        return getattr(getattr(self._vllm, "sampling_params", None), "RequestOutputKind", None)

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        if self._engine is None:
            raise TransientEngineError("the vLLM engine is not started")
        if request_id in self._running:
            raise PermanentEngineError(f"request {request_id!r} is already running")
        prompt_ids = chat_prompt_ids(self._tokenizer, request)
        check_context(len(prompt_ids), request.max_tokens, self.max_model_len)
        params = self.sampling_params(request)
        delta = self._output_kind() is not None
        self._running[request_id] = 0
        pieces: list[str] = []
        reason = None
        answered = False  # a completion output came
        try:
            async for output in self._engine.generate({"prompt_token_ids": prompt_ids}, params, request_id):
                completion = output.outputs[0] if output.outputs else None
                if completion is None:
                    continue
                if delta:
                    pieces.append(completion.text)
                    self._running[request_id] += len(completion.token_ids)
                else:
                    pieces = [completion.text]
                    self._running[request_id] = len(completion.token_ids)
                reason = getattr(completion, "finish_reason", None)
                answered = True
        except Exception as exc:
            if request_id in self._aborted:
                raise GenerationAborted(request_id) from exc
            kind = _error_kind(exc)
            if kind == "fatal" or getattr(self._engine, "errored", False) is True:
                raise FatalEngineError(f"the vLLM engine is dead: {type(exc).__name__}: {exc}") from exc
            if kind == "permanent":
                raise PermanentEngineError(f"vLLM refused the request: {exc}") from exc
            raise TransientEngineError(f"vLLM failed: {type(exc).__name__}: {exc}") from exc
        finally:
            completion_tokens = self._running.pop(request_id, 0)
            aborted = request_id in self._aborted
            self._aborted.discard(request_id)
        if aborted or reason == "abort":
            raise GenerationAborted(request_id)
        if not answered or reason not in ("stop", "length"):
            # The stream ended without a finished completion: nothing to store, but the job may succeed again.
            raise TransientEngineError(f"vLLM ended request {request_id} without a result (finish_reason={reason!r})")
        return Generation.single(
            text="".join(pieces),
            finish_reason=reason,
            prompt_tokens=len(prompt_ids),
            completion_tokens=completion_tokens,
        )

    def tokens_so_far(self, request_id: str) -> int | None:
        return self._running.get(request_id)

    async def abort(self, request_id: str) -> None:
        if request_id not in self._running or self._engine is None:
            return
        self._aborted.add(request_id)
        await self._engine.abort(request_id)
