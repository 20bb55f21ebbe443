"""What both vLLM engines do the same way: the chat engine (``gpu_worker.engines.vllm_engine.VllmEngine``) and the
embedding engine (``gpu_worker.engines.vllm_embedding.VllmEmbeddingEngine``).

``VllmOptions`` are the options both take by keyword (the worker gives them from ``ENGINE_OPTIONS["vllm"]``), and
``VllmBase`` makes vLLM's engine from them as ``vllm run-batch`` makes its own: run-batch's command-line defaults, the
options set on them, the ``AsyncLLMEngine`` and ``init_app_state`` over it (which builds the serving objects), then
shuts it down. Each engine adds what is its own: its runner's arguments (the pooling runner, the chat engine's seed and
tool-call parser), the serving object it drives and the translation of its requests and answers.

Errors are classified by type (``error_kind``: the classes vLLM and torch define, and Python's own) as permanent (vLLM
refused the request), transient (the job is retried) or fatal (the engine is dead: the worker stops and hands its jobs
back for a fresh process); ``gpu_worker.engines.vllm_engine`` says which error is which.

vLLM is imported only in ``start`` (or by the caller who passes ``vllm_module``), so this module imports on machines
without it.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpu_worker.engines.base import (
    Engine,
    EngineError,
    FatalEngineError,
    PermanentEngineError,
    TransientEngineError,
)

DEFAULT_MAX_NUM_SEQS = 64

# (module, class) -> kind; checked in this order, so the most specific class decides (EngineDeadError is a
# VLLMServerError, and fatal). Classes a vLLM or torch version lacks are left out.
_ERROR_CLASSES: list[tuple[str, str, str]] = [
    ("vllm.v1.engine.exceptions", "EngineDeadError", "fatal"),
    ("vllm.engine.async_llm_engine", "AsyncEngineDeadError", "fatal"),  # the v0 engines
    ("vllm.engine.multiprocessing", "MQEngineDeadError", "fatal"),
    ("torch", "AcceleratorError", "fatal"),
    ("vllm.exceptions", "VLLMClientError", "permanent"),
    ("builtins", "ValueError", "permanent"),
    ("builtins", "TypeError", "permanent"),
    ("vllm.v1.engine.exceptions", "EngineGenerateError", "transient"),
    ("vllm.exceptions", "VLLMServerError", "transient"),
    ("torch", "OutOfMemoryError", "transient"),
    ("builtins", "RuntimeError", "transient"),
]
# torch before AcceleratorError raised CUDA faults as RuntimeError("CUDA error: ..."); they are sticky.
_CUDA_ERROR_PREFIX = "CUDA error"


def error_classes() -> list[tuple[type[BaseException], str]]:
    """The error classes this process has, with their kind (importing only modules that are there)."""
    found: list[tuple[type[BaseException], str]] = []
    for module_name, name, kind in _ERROR_CLASSES:
        try:
            module = builtins if module_name == "builtins" else importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append((cls, kind))
    return found


def error_kind(exc: BaseException, classes: list[tuple[type[BaseException], str]]) -> str | None:
    for cls, kind in classes:
        if isinstance(exc, cls):
            if kind == "transient" and str(exc).startswith(_CUDA_ERROR_PREFIX):
                return "fatal"
            return kind
    return None


@dataclass(frozen=True, kw_only=True)
class VllmOptions:
    """The options every vLLM engine takes, by keyword; one left at None is vLLM's default."""

    model: str | None = None  # a Hugging Face model directory or name: required (None only to say so clearly)
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    served_model_name: str | None = None
    # set on vLLM's arguments as they are (any option `vllm run-batch` takes, by its attribute name), over the others
    engine_kwargs: dict[str, Any] | None = None
    vllm_module: ModuleType | None = None  # replaces `import vllm` (tests pass a fake)

    def engine_args(self, **own: Any) -> dict[str, Any]:
        """vLLM's arguments by ``vllm run-batch``'s attribute names: the model and batch size, the options that are
        set, the engine's ``own`` that are set (its runner, a seed), and ``engine_kwargs`` over all of them."""
        optional = {
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
            "served_model_name": [self.served_model_name] if self.served_model_name else None,
            **own,
        }
        return {
            "model": self.model,
            "max_num_seqs": self.max_num_seqs,
            **{k: v for k, v in optional.items() if v is not None},
            **(self.engine_kwargs or {}),
        }


class VllmBase(Engine):
    """What a vLLM engine holds and does whatever its runner: the options, vLLM's engine (built by the engine's
    ``start`` with the helpers below, shut down by ``close``), its capacity and context length, and the
    classification of its errors."""

    def __init__(self, options: VllmOptions, **own_args: Any) -> None:
        """``own_args`` are vLLM arguments of this engine's own (``VllmOptions.engine_args``)."""
        if not options.model:
            raise ValueError("the vLLM engine needs a model (env MODEL): a Hugging Face model directory or name")
        self._model = options.model
        self._served_name = options.served_model_name or options.model
        self._max_num_seqs = options.max_num_seqs
        self._max_model_len = options.max_model_len
        self._engine_kwargs = options.engine_args(**own_args)
        self._vllm: Any = options.vllm_module
        self._engine: Any = None
        self._errors = error_classes()

    @property
    def capacity(self) -> int:
        return self._max_num_seqs

    @property
    def max_model_len(self) -> int:
        if self._max_model_len is None:
            raise RuntimeError("max_model_len is known once the engine has started")
        return self._max_model_len

    def _load_vllm(self) -> None:
        """``import vllm``, unless a module was given."""
        if self._vllm is None:
            try:
                import vllm
            except ImportError as exc:
                raise PermanentEngineError("ENGINE=vllm needs the vllm package (the vllm/vllm-openai image)") from exc
            self._vllm = vllm

    def _run_batch_args(self, *flags: str) -> Any:
        """``vllm run-batch``'s arguments: its parser's defaults with ``flags`` parsed, then this engine's arguments
        set on them."""
        from vllm.entrypoints.launchers.run_batch import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["-i", "unused", "-o", "unused", *flags])
        for name, value in self._engine_kwargs.items():
            setattr(args, name, value)
        return args

    def _new_engine(self, args: Any) -> Any:
        """vLLM's async engine made from ``args`` (vLLM loads the weights and profiles memory: tens of seconds)."""
        return self._vllm.AsyncLLMEngine.from_engine_args(self._vllm.AsyncEngineArgs.from_cli_args(args))

    @staticmethod
    async def _app_state(client: Any, args: Any) -> Any:
        """The state vLLM's ``init_app_state`` fills over the engine ``client`` (its serving objects), as for
        ``vllm run-batch`` and ``vllm serve``."""
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        state = State()
        await init_app_state(client, state, args, await client.get_supported_tasks())
        return state

    async def close(self) -> None:
        if self._engine is not None:
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                result = shutdown()
                if inspect.isawaitable(result):
                    await result
            self._engine = None

    def _failure(
        self, exc: Exception, refusal: Callable[[str], PermanentEngineError] = PermanentEngineError
    ) -> EngineError:
        """The engine error that ``exc``, raised by vLLM for a request, is (see the module docstring); ``refusal``
        makes the permanent one from its message."""
        kind = error_kind(exc, self._errors)
        if kind == "fatal" or getattr(self._engine, "errored", False) is True:
            return FatalEngineError(f"the vLLM engine is dead: {type(exc).__name__}: {exc}")
        if kind == "permanent":
            return refusal(f"vLLM refused the request: {exc}")
        return TransientEngineError(f"vLLM failed: {type(exc).__name__}: {exc}")
