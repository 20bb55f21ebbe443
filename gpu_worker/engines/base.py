"""The interface every inference engine implements.

The worker hands an engine one job at a time, concurrently, up to ``capacity`` at once; batching is the engine's
business (vLLM batches continuously inside itself, the CPU engine gathers concurrent calls into batches).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Literal

from async_inference.schemas import ChatCompletionRequest

FinishReason = Literal["stop", "length", "tool_calls", "function_call"]


@dataclass(frozen=True)
class TopLogprob:
    """One candidate token at a position, OpenAI's ``top_logprobs[j]``: its text, log probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token, OpenAI's ``logprobs.content[k]``: the token and the ``top_logprobs`` most likely ones at
    its position (as many as the request asked, possibly none)."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made: ``arguments`` is the JSON text of the arguments, as OpenAI sends it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Completion:
    """One choice: text, tool calls or both (a model may say something before calling), why it ended, and the
    logprobs of its tokens when the request asked for them (None otherwise).

    ``finish_reason`` is OpenAI's: ``stop`` (end token or stop string), ``length`` (max_tokens reached: the text may
    be cut, structured output included), ``tool_calls`` (the model called tools), ``function_call`` (the same for a
    request that used the legacy ``functions``: the call is then ``function_call``, the first of ``tool_calls``)."""

    text: str | None
    finish_reason: FinishReason
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class Generation:
    """What an engine returns for one request: its ``n`` choices and the token counts (completion tokens summed over
    the choices, as OpenAI and vLLM count them)."""

    choices: tuple[Completion, ...]
    prompt_tokens: int
    completion_tokens: int
    system_fingerprint: str | None = None

    @property
    def text(self) -> str:
        """The first choice's text ("" when it only called tools)."""
        return self.choices[0].text or ""

    @property
    def finish_reason(self) -> FinishReason:
        return self.choices[0].finish_reason

    @classmethod
    def single(cls, text: str, finish_reason: FinishReason, prompt_tokens: int, completion_tokens: int) -> Generation:
        """A generation of one plain-text choice."""
        return cls((Completion(text, finish_reason),), prompt_tokens, completion_tokens)


class EngineError(Exception):
    """Base of engine errors."""


class PermanentEngineError(EngineError):
    """The request can never succeed on this engine (prompt longer than the context, bad model name...).
    The worker fails the job at once with this message as the reason, and ``code`` as its error code: the request's
    fault, which a client must fix rather than retry (a 400, as a batch line's is)."""

    code = "invalid_request"


class PromptTooLongError(PermanentEngineError):
    code = "context_length_exceeded"  # OpenAI's code for it


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

    async def start(self) -> None:  # noqa: B027 (optional hook)
        """Load weights, warm up. Called once before the first ``generate``."""

    @abc.abstractmethod
    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        """Run one chat request to completion. Raises ``PermanentEngineError``, ``TransientEngineError``,
        ``FatalEngineError`` or ``GenerationAborted``."""

    async def abort(self, request_id: str) -> None:  # noqa: B027 (optional hook)
        """Stop a running request; its ``generate`` raises ``GenerationAborted``. Unknown ids are ignored."""

    def tokens_so_far(self, request_id: str) -> int | None:
        """Completion tokens a running request has generated so far; None when the request is not running here or the
        engine cannot tell. Cheap and non-blocking: the worker reads it for every running job at each progress beat."""
        return None

    def texts_so_far(self, request_id: str) -> tuple[str, ...] | None:
        """Each choice's text so far, of a running request (what it would answer now, before stop strings are cut);
        None when the request is not running here or the engine cannot tell (a streamed job's text then comes whole
        at its end). Non-blocking; the worker reads it for streamed jobs several times a second (gpu_worker.deltas)."""
        return None

    async def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the engine's resources."""
