"""The interface every inference engine implements.

The worker hands an engine one job at a time, concurrently, up to ``capacity`` at once; batching is the engine's
business (vLLM batches continuously inside itself, the CPU engine gathers concurrent calls into batches).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Literal

from async_inference.schemas import ChatCompletionRequest


@dataclass(frozen=True)
class Generation:
    """What an engine returns for one request."""

    text: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


class EngineError(Exception):
    """Base of engine errors."""


class PermanentEngineError(EngineError):
    """The request can never succeed on this engine (prompt longer than the context, bad model name...).
    The worker fails the job at once with this message as the reason."""


class PromptTooLongError(PermanentEngineError):
    pass


class TransientEngineError(EngineError):
    """A fault that may clear (out of memory, engine restarting). The worker leaves the message for redelivery."""


class FatalEngineError(EngineError):
    """The engine is dead (vLLM's EngineDeadError, a CUDA fault): no request can run in this process any more.
    The worker stops receiving, hands back every message it holds without failing their jobs, and exits with
    ``gpu_worker.worker.EXIT_ENGINE_DEAD`` so that its supervisor (ECS) replaces it with a fresh process."""


class GenerationAborted(EngineError):
    """Raised by ``generate`` when ``abort`` was called for its request."""


class Engine(abc.ABC):
    """An inference engine, created once per process."""

    name: str = "engine"

    @property
    @abc.abstractmethod
    def capacity(self) -> int:
        """How many requests the engine can batch at once: the worker keeps this many in flight."""

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int:
        """Context length in tokens (prompt + completion)."""

    async def start(self) -> None:
        """Load weights, warm up. Called once before the first ``generate``."""

    @abc.abstractmethod
    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        """Run one chat request to completion. Raises ``PermanentEngineError``, ``TransientEngineError``,
        ``FatalEngineError`` or ``GenerationAborted``."""

    async def abort(self, request_id: str) -> None:
        """Stop a running request; its ``generate`` raises ``GenerationAborted``. Unknown ids are ignored."""

    def tokens_so_far(self, request_id: str) -> int | None:
        """Completion tokens a running request has generated so far; None when the request is not running here or the
        engine cannot tell. Cheap and non-blocking: the worker reads it for every running job at each progress beat."""
        return None

    async def close(self) -> None:
        """Release the engine's resources."""
