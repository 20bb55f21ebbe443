"""One request of any endpoint a batch line (or a job) may carry, on the engine: ``run`` hands it to the engine's
method for it, ``body`` turns what the engine gave into OpenAI's answer for that endpoint. A chat.completions request
is generated and answered as ``chat.completion`` (``gpu_worker.completions``); an embeddings request is embedded and
answered as the embedding list (``async_inference.schemas.embeddings``); a completions request is generated as its raw
prompt and answered as ``text_completion`` (``async_inference.schemas.completions``); a responses request is generated
as the chat request a background response runs, and answered as the Response, by the conversions the API uses for a
background response (``async_inference.responses``)."""

from __future__ import annotations

from typing import TypedDict

from pydantic import BaseModel

from async_inference.endpoints import LineRequest
from async_inference.responses import ResponseRun, to_chat_request, to_response
from async_inference.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    embedding_list,
    text_completion,
)
from async_inference.schemas.responses import ResponseCreate
from gpu_worker.completions import chat_completion
from gpu_worker.engines.base import Engine, Generation, PermanentEngineError
from gpu_worker.engines.embedding import EmbeddingEngine, Embeddings, not_an_embedding_engine

Output = Generation | Embeddings


async def run(engine: Engine, request_id: str, request: LineRequest) -> Output:
    """The engine's output for ``request``; the engine's errors as they come (``PermanentEngineError``: a 400)."""
    if isinstance(request, EmbeddingRequest):
        if not isinstance(engine, EmbeddingEngine):
            raise not_an_embedding_engine(engine, request.model)
        return await engine.embed(request_id, request.texts, dimensions=request.dimensions)
    return await engine.generate(request_id, chat_request(engine, request))


class EngineCost(TypedDict):
    """What a request takes of the engine, as ``gpu_worker.lanes.Admission.slot`` counts it."""

    rows: int  # its n (one for an embedding or a response)
    max_tokens: int  # the most tokens each row may generate


def engine_cost(request: LineRequest) -> EngineCost:
    rows = getattr(request, "n", None) or 1
    max_tokens = getattr(request, "max_tokens", None) or getattr(request, "max_output_tokens", None) or 0
    return EngineCost(rows=rows, max_tokens=max_tokens)


def chat_request(engine: Engine, request: LineRequest) -> ChatCompletionRequest:
    """The chat request a generating request runs."""
    if isinstance(request, CompletionRequest):
        if engine.name == "vllm":
            # vLLM refuses a request's own chat template; its completion serving is not wired to this engine yet.
            raise PermanentEngineError("/v1/completions lines are not run by the vLLM engine yet: use chat.completions")
        return request.to_chat()
    if isinstance(request, ResponseCreate):
        return to_chat_request(request)
    assert isinstance(request, ChatCompletionRequest)
    return request


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
    completion = chat_completion(output, completion_id=f"chatcmpl-{suffix}", model=request.model, job_id=job_id)
    if isinstance(request, CompletionRequest):
        return text_completion(completion, completion_id=f"cmpl-{suffix}")
    if isinstance(request, ResponseCreate):
        return to_response(ResponseRun.batch_line(suffix, request), request, completion)
    return completion
