"""An embedding model on vLLM's pooling runner, driven through vLLM's own embeddings layer.

vLLM runs an embedding model with ``runner="pooling"`` (``--runner pooling``): the model's pooler (for a
sentence-transformers directory, the pooling and normalisation its ``modules.json`` names) instead of a sampler. The
request goes to the serving object that ``vllm serve`` and ``vllm run-batch`` hand a ``/v1/embeddings`` body to
(``ServingEmbedding``, made by ``init_app_state`` from run-batch's command-line defaults plus this engine's options,
as ``VllmEngine`` makes its chat serving object), so tokenisation, the input limit, ``dimensions`` (Matryoshka models
only) and pooling are vLLM's. The adapter translates: in, the texts as vLLM's ``EmbeddingCompletionRequest`` (floats:
this service encodes base64 itself, ``async_inference.schemas.embeddings``); out, the vectors and
``usage.prompt_tokens``.

The options, the engine's start and close and the classification of errors are ``VllmEngine``'s, shared in
``gpu_worker.engines.vllm_common`` (``error_kind``); an error response (vLLM answers a request it refuses with a 4xx
body) is permanent, a 5xx transient. vLLM is imported only in ``start``, so this module imports on machines without
it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from gpu_worker.engines.base import GenerationAborted, PermanentEngineError, TransientEngineError
from gpu_worker.engines.embedding import EmbeddingEngine, Embeddings
from gpu_worker.engines.vllm_common import VllmBase, VllmOptions

logger = logging.getLogger(__name__)


class VllmEmbeddingEngine(VllmBase, EmbeddingEngine):
    name = "vllm-embedding"

    def __init__(self, *, tool_call_parser: str | None = None, **options: Any) -> None:
        """The options are every vLLM engine's (``VllmOptions``); ``tool_call_parser``, a chat option the worker passes
        to every vllm engine, is unused here."""
        super().__init__(VllmOptions(**options), runner="pooling")
        self._serving: Any = None  # vLLM's ServingEmbedding
        self._request_model: Any = None  # vLLM's EmbeddingCompletionRequest
        self._dimension = 0
        self._matryoshka = False
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()

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
        self._load_vllm()
        started = time.monotonic()
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

        args = self._run_batch_args()
        self._engine = self._new_engine(args)
        state = await self._app_state(self._engine, args)
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
            raise self._failure(exc) from exc
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
