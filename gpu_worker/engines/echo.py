"""A deterministic engine for fast tests: the completion is the last user message, cut to max_tokens words.

What it honours of a chat.completions request: ``max_tokens`` / ``max_completion_tokens`` (in words), ``stop``, ``n``
(n identical choices), messages in any form (text parts are joined). Sampling parameters (temperature, top_p, top_k,
min_p, seed, penalties, logit_bias) are accepted and change nothing: the answer is defined as the prompt's words, not
drawn from a distribution. Tools with tool_choice ``auto`` or ``none`` are accepted (the engine never calls one, which
``auto`` allows). Refused with a ``PermanentEngineError`` naming the parameter, because the echoed words would not be
what it asks: ``response_format`` json_object / json_schema, a forced ``tool_choice`` (or ``function_call``), and
``logprobs``.

Tokens are whitespace-separated words. ``max_model_len`` (``ECHO_MAX_MODEL_LEN``) is enforced as the model-backed
engines enforce theirs, so a prompt too long for the context fails the job at once; ``delay_s`` (``ECHO_DELAY_S``)
makes each generation take that long, and ``abort`` ends a delayed generation at once. A delayed generation's
tokens appear at an even pace over the delay (``tokens_so_far``), as a model's would.
"""

from __future__ import annotations

import asyncio
import time

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import asks_of, last_user_text, refuse_beyond_text, text_of
from gpu_worker.engines.base import Completion, Engine, FinishReason, Generation, GenerationAborted
from gpu_worker.engines.common import check_context

DEFAULT_MAX_MODEL_LEN = 1_000_000


class EchoEngine(Engine):
    name = "echo"

    def __init__(self, *, capacity: int = 64, delay_s: float = 0.0, max_model_len: int | None = None) -> None:
        self._capacity = capacity
        self._delay_s = delay_s
        self._max_model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
        self._aborts: dict[str, asyncio.Event] = {}
        # request id -> (time.monotonic() at start, its tokens, its choice's text)
        self._running: dict[str, tuple[float, int, str]] = {}

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        asks = asks_of(request)
        refuse_beyond_text(asks, self.name)
        prompt = " ".join(text_of(m.get("content")) for m in asks.messages)
        prompt_tokens = len(prompt.split())
        check_context(prompt_tokens, asks.max_tokens, self._max_model_len)
        words = last_user_text(asks).split()
        text = " ".join(words[: asks.max_tokens])
        finish: FinishReason = "length" if len(words) > asks.max_tokens else "stop"
        for stop in asks.stop:
            if stop in text:
                text, finish = text.split(stop, 1)[0], "stop"
        tokens = len(text.split())
        generation = Generation(
            choices=(Completion(text, finish),) * asks.n, prompt_tokens=prompt_tokens, completion_tokens=tokens * asks.n
        )
        aborted = self._aborts.setdefault(request_id, asyncio.Event())
        self._running[request_id] = (time.monotonic(), generation.completion_tokens, text)
        try:
            if self._delay_s:
                try:
                    await asyncio.wait_for(aborted.wait(), timeout=self._delay_s)
                except TimeoutError:
                    pass
            if aborted.is_set():
                raise GenerationAborted(request_id)
        finally:
            self._aborts.pop(request_id, None)
            self._running.pop(request_id, None)
        return generation

    async def abort(self, request_id: str) -> None:
        event = self._aborts.get(request_id)
        if event is not None:  # unknown or finished ids are ignored, as the interface says
            event.set()

    def tokens_so_far(self, request_id: str) -> int | None:
        running = self._running.get(request_id)
        if running is None:
            return None
        started, tokens, _ = running
        if not self._delay_s:
            return tokens
        return min(tokens, int(tokens * (time.monotonic() - started) / self._delay_s))

    def texts_so_far(self, request_id: str) -> tuple[str, ...] | None:
        running = self._running.get(request_id)
        if running is None:
            return None
        started, tokens, text = running
        words = text.split()
        shown = len(words) if not self._delay_s else int(len(words) * (time.monotonic() - started) / self._delay_s)
        return (" ".join(words[: min(shown, len(words))]),)
