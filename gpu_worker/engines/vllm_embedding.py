"""An embedding model on vLLM's pooling runner, driven through vLLM's own embeddings layer.

vLLM runs an embedding model with ``runner="pooling"`` (``--runner pooling``): the model's pooler (for a
sentence-transformers directory, the pooling and normalisation its ``modules.json`` names) instead of a sampler. The
request goes to the serving object that ``vllm serve`` and ``vllm run-batch`` hand a ``/v1/embeddings`` body to
(``ServingEmbedding``, made by ``init_app_state`` from run-batch's command-line defaults plus this engine's options,
as ``VllmEngine`` makes its chat serving object), so tokenisation, the input limit, ``dimensions`` (Matryoshka models
only) and pooling are vLLM's. The adapter translates: in, the texts as vLLM's ``EmbeddingCompletionRequest`` (floats:
this service encodes base64 itself, ``async_inference.embeddings``); out, the vectors and ``usage.prompt_tokens``.

Errors are classified as ``VllmEngine`` classifies them (``gpu_worker.engines.vllm_engine.error_kind``); an error
response (vLLM answers a request it refuses with a 4xx body) is permanent, a 5xx transient. vLLM is imported only in
``start``, so this module imports on machines without it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from gpu_worker.engines.base import (
    FatalEngineError,
    GenerationAborted,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.engines.embedding import EmbeddingEngine, Embeddings
from gpu_worker.engines.vllm_engine import error_classes, error_kind

logger = logging.getLogger(__name__)
DEFAULT_MAX_NUM_SEQS = 64


class VllmEmbeddingEngine(EmbeddingEngine):
    name = "vllm-embedding"

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
        tool_call_parser: str | None = None,  # a chat option the worker passes to every vllm engine: unused here
        engine_kwargs: dict[str, Any] | None = None,
        vllm_module: ModuleType | None = None,
    ) -> None:
        if not model:
            raise ValueError("the vLLM engine needs a model (env MODEL): a Hugging Face model directory or name")
        self._model = model
        self._served_name = served_model_name or model
        self._max_num_seqs = max_num_seqs
        self._max_model_len = max_model_len
        optional = {
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
            "tensor_parallel_size": tensor_parallel_size,
            "dtype": dtype,
            "enforce_eager": enforce_eager,
            "served_model_name": [served_model_name] if served_model_name else None,
        }
        self._engine_kwargs = {
            "model": model,
            "runner": "pooling",
            "max_num_seqs": max_num_seqs,
            **{k: v for k, v in optional.items() if v is not None},
            **(engine_kwargs or {}),
        }
        self._vllm = vllm_module
        self._engine: Any = None
        self._serving: Any = None  # vLLM's ServingEmbedding
        self._request_model: Any = None  # vLLM's EmbeddingCompletionRequest
        self._dimension = 0
        self._matryoshka = False
        self._errors = error_classes()
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()

    @property
    def capacity(self) -> int:
        return self._max_num_seqs

    @property
    def max_model_len(self) -> int:
        if self._max_model_len is None:
            raise RuntimeError("max_model_len is known once the engine has started")
        return self._max_model_len

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def matryoshka(self) -> bool:
        return self._matryoshka

    async def start(self) -> None:
        """Build the engine with the pooling runner and vLLM's embeddings serving object (in the event loop's
        thread, as vLLM's server does)."""
        if self._engine is not None:
            return
        if self._vllm is None:
            try:
                import vllm
            except ImportError as exc:
                raise PermanentEngineError("ENGINE=vllm needs the vllm package (the vllm/vllm-openai image)") from exc
            self._vllm = vllm
        started = time.monotonic()
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.run_batch import make_arg_parser
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["-i", "unused", "-o", "unused"])
        for name, value in self._engine_kwargs.items():
            setattr(args, name, value)
        self._engine = self._vllm.AsyncLLMEngine.from_engine_args(self._vllm.AsyncEngineArgs.from_cli_args(args))
        state = State()
        await init_app_state(self._engine, state, args, await self._engine.get_supported_tasks())
        self._serving = getattr(state, "serving_embedding", None)
        if self._serving is None:
            raise PermanentEngineError(f"vLLM's pooling runner does not serve embeddings for {self._model}")
        self._request_model = EmbeddingCompletionRequest
        model_config = self._engine.model_config
        self._max_model_len = int(model_config.max_model_len)
        self._dimension = int(model_config.get_hidden_size())
        self._matryoshka = bool(model_config.is_matryoshka)
        logger.info(
            "vllm embedding engine: %s ready in %.1f s (%d dimensions, inputs up to %d tokens, matryoshka %s)",
            self._model,
            time.monotonic() - started,
            self._dimension,
            self._max_model_len,
            self._matryoshka,
        )

    async def close(self) -> None:
        if self._engine is not None:
            shutdown = getattr(self._engine, "shutdown", None)
            if shutdown is not None:
                result = shutdown()
                if inspect.isawaitable(result):
                    await result
            self._engine = None

    async def embed(self, request_id: str, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        if self._engine is None:
            raise TransientEngineError("the vLLM engine is not started")
        self.check_dimensions(dimensions)
        body: dict[str, Any] = {"model": self._served_name, "input": list(texts), "request_id": request_id}
        if dimensions is not None and dimensions != self._dimension:
            body["dimensions"] = dimensions
        try:
            vllm_request = self._request_model.model_validate(body)
        except ValueError as exc:
            raise PermanentEngineError(f"vLLM refused the request: {exc}") from exc
        task = asyncio.ensure_future(self._serving(vllm_request))
        self._tasks[request_id] = task
        try:
            response = await task
        except asyncio.CancelledError:
            if request_id in self._aborted:
                raise GenerationAborted(request_id) from None
            task.cancel()
            raise
        except Exception as exc:
            kind = error_kind(exc, self._errors)
            if kind == "fatal" or getattr(self._engine, "errored", False) is True:
                raise FatalEngineError(f"the vLLM engine is dead: {type(exc).__name__}: {exc}") from exc
            if kind == "permanent":
                raise PermanentEngineError(f"vLLM refused the request: {exc}") from exc
            raise TransientEngineError(f"vLLM failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._tasks.pop(request_id, None)
            self._aborted.discard(request_id)
        return self._embeddings(response)

    @staticmethod
    def _embeddings(response: Any) -> Embeddings:
        """vLLM's answer (a JSONResponse, or the response model itself) as vectors in input order."""
        status = int(getattr(response, "status_code", 200))
        payload = json.loads(response.body) if hasattr(response, "body") else response.model_dump(mode="json")
        if status >= 400 or "error" in payload:
            message = (payload.get("error") or {}).get("message", payload) if isinstance(payload, dict) else payload
            if status >= 500:
                raise TransientEngineError(f"vLLM failed: {message}")
            raise PermanentEngineError(f"vLLM refused the request: {message}")
        data = sorted(payload["data"], key=lambda item: item["index"])
        return Embeddings(
            vectors=tuple(tuple(float(x) for x in item["embedding"]) for item in data),
            prompt_tokens=int(payload["usage"]["prompt_tokens"]),
        )

    async def abort(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None and not task.done():
            self._aborted.add(request_id)
            task.cancel()
