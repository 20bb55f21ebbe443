"""What an engine serving an embedding model implements, beside (instead of) generation.

An ``EmbeddingEngine`` is an ``Engine`` (the worker's admission, capacity, start and close are the same) whose
``embed`` turns texts into vectors; its ``generate`` refuses a chat request, which reaches it only when a client sends
chat to the embedding model's name. A chat engine has no ``embed``: the runner answers an embeddings request sent to
it with the same kind of refusal (``not_an_embedding_engine``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import Engine, Generation, PermanentEngineError


@dataclass(frozen=True)
class Embeddings:
    """One request's vectors, in input order, and the tokens its inputs took."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int


class EmbeddingEngine(Engine):
    """An engine that serves an embedding model."""

    @property
    @abc.abstractmethod
    def dimension(self) -> int:
        """The length of the model's vectors."""

    @property
    def matryoshka(self) -> bool:
        """Whether the model was trained so that a vector's first ``dimensions`` values are an embedding on their own
        (OpenAI's ``dimensions`` parameter). False: only the model's own dimension is accepted."""
        return False

    @abc.abstractmethod
    async def embed(self, request_id: str, texts: Sequence[str], *, dimensions: int | None = None) -> Embeddings:
        """The vectors of ``texts``, normalised, cut to ``dimensions`` where the model allows it (see
        ``check_dimensions``). Raises ``PermanentEngineError`` (an input over the model's length, ``dimensions`` the
        model cannot give), ``TransientEngineError`` or ``FatalEngineError``."""

    def check_dimensions(self, dimensions: int | None) -> None:
        """Refuse a ``dimensions`` this model cannot give, naming the parameter."""
        if dimensions is None or dimensions == self.dimension:
            return
        if not self.matryoshka:
            raise PermanentEngineError(
                f"dimensions: this model gives vectors of {self.dimension} values and cannot shorten them; "
                f"leave dimensions out (or set it to {self.dimension})"
            )
        if dimensions > self.dimension:
            raise PermanentEngineError(f"dimensions: at most {self.dimension} for this model, got {dimensions}")

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        raise PermanentEngineError(
            f"model {request.model!r} is an embedding model: send /v1/embeddings requests to it, not chat"
        )


def not_an_embedding_engine(engine: Engine, model: str) -> PermanentEngineError:
    """The refusal of an embeddings request that reached a worker serving a chat model."""
    return PermanentEngineError(
        f"model {model!r} is served by a chat engine ({engine.name}) here: /v1/embeddings needs an embedding model"
    )
