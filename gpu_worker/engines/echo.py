"""A deterministic engine for fast tests: the completion is the last user message, cut to max_tokens words."""

from __future__ import annotations

import asyncio

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import Engine, GenerationAborted, Generation


class EchoEngine(Engine):
    name = "echo"

    def __init__(self, *, capacity: int = 64, delay_s: float = 0.0) -> None:
        self._capacity = capacity
        self._delay_s = delay_s
        self._aborted: set[str] = set()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_model_len(self) -> int:
        return 1_000_000

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            raise GenerationAborted(request_id)
        prompt = " ".join(m.content for m in request.messages)
        last_user = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        words = last_user.split()
        text = " ".join(words[: request.max_tokens])
        finish = "length" if len(words) > request.max_tokens else "stop"
        for stop in request.stop_sequences:
            if stop in text:
                text, finish = text.split(stop, 1)[0], "stop"
        return Generation(
            text=text,
            finish_reason=finish,
            prompt_tokens=len(prompt.split()),
            completion_tokens=len(text.split()),
        )

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
