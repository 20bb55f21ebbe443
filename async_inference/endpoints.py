"""The OpenAI endpoints a batch's lines may target, and each one's request model: one table, read by the batch API
(which endpoints a batch may name), the planner (each line's ``url`` is the batch's) and the worker (which model a
line's ``body`` is validated with, and what runs it). docs/design/embeddings.md says what each endpoint's lines
become."""

from __future__ import annotations

from typing import Any, Literal

from async_inference.schemas import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
)
from async_inference.schemas.responses import BATCH_LINE, ResponseCreate

RESPONSES_ENDPOINT = "/v1/responses"
BatchEndpoint = Literal["/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses"]

LineRequest = ChatCompletionRequest | EmbeddingRequest | CompletionRequest | ResponseCreate

# url -> (the request model, the name its 400s use)
_MODELS: dict[str, tuple[type[Any], str]] = {
    CHAT_ENDPOINT: (ChatCompletionRequest, "chat.completions"),
    EMBEDDINGS_ENDPOINT: (EmbeddingRequest, "embeddings"),
    COMPLETIONS_ENDPOINT: (CompletionRequest, "completions"),
    RESPONSES_ENDPOINT: (ResponseCreate, "responses"),
}
# What says how a background response is kept: a batch line's answer is kept in the batch's output file instead, so
# a responses line runs whatever they say (OpenAI's batch lines carry neither).
_RESPONSE_KEEPING = ("background", "store")
BATCH_ENDPOINTS = tuple(_MODELS)


def request_name(url: str) -> str:
    """How a 400 names the request a url takes (``chat.completions``, ``embeddings``...)."""
    return _MODELS[url][1] if url in _MODELS else url


def parse_line_body(url: str, body: dict[str, Any]) -> LineRequest:
    """A line's body as the request its url takes; a pydantic ValidationError (the field to fix) when it is not one.
    A url no batch may name is a ValueError (planning refuses such a batch before any line runs)."""
    if url not in _MODELS:
        raise ValueError(f"url {url!r} is not one of {', '.join(BATCH_ENDPOINTS)}")
    model: Any = _MODELS[url][0]
    if url == RESPONSES_ENDPOINT:
        body = {**{k: v for k, v in body.items() if k not in _RESPONSE_KEEPING}, "background": True}
    request: LineRequest = model.model_validate(body, context={BATCH_LINE: True})
    return request
