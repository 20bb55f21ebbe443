"""One request of any endpoint a batch line (or a job) may carry, on the engine: ``run`` hands it to the engine's
method for it, ``body`` turns what the engine gave into OpenAI's answer for that endpoint. A chat.completions request
is generated and answered as ``chat.completion`` (``gpu_worker.completions``); an embeddings request is embedded and
answered as the embedding list (``async_inference.embeddings``)."""

from __future__ import annotations

from pydantic import BaseModel

from async_inference.embeddings import EmbeddingRequest, embedding_list
from async_inference.endpoints import LineRequest
from gpu_worker.completions import chat_completion
from gpu_worker.engines.base import Engine, Generation
from gpu_worker.engines.embedding import EmbeddingEngine, Embeddings, not_an_embedding_engine

Output = Generation | Embeddings


async def run(engine: Engine, request_id: str, request: LineRequest) -> Output:
    """The engine's output for ``request``; the engine's errors as they come (``PermanentEngineError``: a 400)."""
    if isinstance(request, EmbeddingRequest):
        if not isinstance(engine, EmbeddingEngine):
            raise not_an_embedding_engine(engine, request.model)
        return await engine.embed(request_id, request.texts, dimensions=request.dimensions)
    return await engine.generate(request_id, request)


def body(request: LineRequest, output: Output, *, suffix: str, job_id: str | None = None) -> BaseModel:
    """OpenAI's answer to ``request`` from the engine's ``output``; ``suffix`` makes its id (``chatcmpl-{suffix}``),
    ``job_id`` is set on a job's result object only."""
    if isinstance(request, EmbeddingRequest):
        assert isinstance(output, Embeddings)
        return embedding_list(
            output.vectors,
            model=request.model,
            prompt_tokens=output.prompt_tokens,
            encoding_format=request.encoding_format,
            job_id=job_id,
        )
    assert isinstance(output, Generation)
    return chat_completion(output, completion_id=f"chatcmpl-{suffix}", model=request.model, job_id=job_id)
