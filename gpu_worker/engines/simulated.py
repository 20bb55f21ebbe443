"""An engine with a known throughput ceiling, for benchmarking everything around the model.

It behaves like a continuous-batching engine with ``capacity`` slots that advances every running sequence by one
token per decoding step of ``step_s`` seconds. A request waits for a free slot, then holds it for one step per output
token. So no worker, queue or autoscaler in front of it can get more than ``capacity / step_s`` tokens/s out of it,
and :attr:`SimulatedEngine.stats` tells how close a run came (slot utilisation).

The output is deterministic: the words of the last user message, one word per token, repeated when the request
asks for more tokens than the message has. Its length in tokens is

    ``output_tokens`` (constructor option) if set, else the number of words in the last user message (at least 1),
    cut to the request's ``max_tokens``.

``finish_reason`` is ``"length"`` when ``max_tokens`` cut it, else ``"stop"``; a stop sequence found in the text cuts
it there (finish ``"stop"``), as vLLM does. ``prompt_tokens`` is the number of words in all messages.

Of the other request parameters it honours what the echo engine does (``gpu_worker.engines.echo``), with the same
refusals, except ``n``: every request is one sequence, so ``n`` > 1 is refused.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import asks_of, last_user_text, refuse_beyond_text, text_of
from gpu_worker.engines.base import Engine, FinishReason, Generation, GenerationAborted, PermanentEngineError


@dataclass
class SimulatedStats:
    """Counters since the engine started. ``utilisation`` = busy slot-steps / (capacity * steps run)."""

    capacity: int
    step_s: float
    steps: int = 0  # decoding steps run (the engine runs none while idle)
    busy_slot_steps: int = 0  # sum over steps of the number of sequences advanced in that step
    tokens: int = 0  # output tokens produced (== busy_slot_steps)
    completed: int = 0
    aborted: int = 0
    busy_s: float = 0.0  # wall time spent with at least one sequence running
    max_waiting: int = 0  # longest the queue for a slot grew

    @property
    def utilisation(self) -> float:
        return self.busy_slot_steps / (self.capacity * self.steps) if self.steps else 0.0

    @property
    def ceiling_tokens_per_s(self) -> float:
        return self.capacity / self.step_s


@dataclass
class _Sequence:
    request_id: str
    words: list[str]
    length: int  # tokens to produce
    cut_by_max_tokens: bool
    stops: list[str]
    prompt_tokens: int
    future: asyncio.Future[Generation]
    produced: int = 0


class SimulatedEngine(Engine):
    name = "simulated"

    def __init__(
        self,
        *,
        capacity: int = 64,
        step_s: float = 0.01,
        output_tokens: int | None = None,
        max_model_len: int = 1_000_000,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if step_s <= 0:
            raise ValueError(f"step_s must be > 0, got {step_s}")
        if output_tokens is not None and output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1 or None, got {output_tokens}")
        self._capacity = capacity
        self._step_s = step_s
        self._output_tokens = output_tokens
        self._max_model_len = max_model_len
        self._waiting: collections.OrderedDict[str, _Sequence] = collections.OrderedDict()
        self._running: dict[str, _Sequence] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.stats = SimulatedStats(capacity=capacity, step_s=step_s)

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._step_loop(), name="simulated-engine-steps")

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        await self.start()  # tolerate a caller that skipped start()
        if request_id in self._waiting or request_id in self._running:
            raise ValueError(f"request {request_id!r} is already running")
        asks = asks_of(request)
        refuse_beyond_text(asks, self.name)
        if asks.n != 1:
            raise PermanentEngineError("the simulated engine runs one sequence per request: n must be 1")
        words = last_user_text(asks).split() or ["token"]
        natural = self._output_tokens or len(words)
        seq = _Sequence(
            request_id=request_id,
            words=words,
            length=min(natural, asks.max_tokens),
            cut_by_max_tokens=natural > asks.max_tokens,
            stops=asks.stop,
            prompt_tokens=sum(len(text_of(m.get("content")).split()) for m in asks.messages),
            future=asyncio.get_running_loop().create_future(),
        )
        self._waiting[request_id] = seq
        self.stats.max_waiting = max(self.stats.max_waiting, len(self._waiting))
        self._wake.set()
        try:
            return await seq.future
        finally:
            # A cancelled caller (a timeout in the worker) frees its slot.
            self._waiting.pop(request_id, None)
            self._running.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        seq = self._waiting.pop(request_id, None) or self._running.pop(request_id, None)
        if seq is not None and not seq.future.done():
            self.stats.aborted += 1
            seq.future.set_exception(GenerationAborted(request_id))

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
        for seq in [*self._waiting.values(), *self._running.values()]:
            if not seq.future.done():
                seq.future.set_exception(GenerationAborted(seq.request_id))
        self._waiting.clear()
        self._running.clear()

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
            # Ticks are scheduled on an absolute clock so that event-loop jitter does not lower the ceiling: a late
            # step is followed by an early one. After idling, the clock restarts.
            started = next_tick = loop.time()
            while self._waiting or self._running:
                while self._waiting and len(self._running) < self._capacity:
                    request_id, seq = self._waiting.popitem(last=False)
                    self._running[request_id] = seq
                next_tick += self._step_s
                await asyncio.sleep(max(0.0, next_tick - loop.time()))
                self._advance()
            self.stats.busy_s += loop.time() - started

    def _advance(self) -> None:
        """One decoding step: every running sequence gains one token; finished ones free their slot."""
        if not self._running:
            return
        self.stats.steps += 1
        self.stats.busy_slot_steps += len(self._running)
        self.stats.tokens += len(self._running)
        for request_id, seq in list(self._running.items()):
            seq.produced += 1
            if seq.produced >= seq.length:
                del self._running[request_id]
                self.stats.completed += 1
                if not seq.future.done():
                    seq.future.set_result(self._result(seq))

    @staticmethod
    def _result(seq: _Sequence) -> Generation:
        text = " ".join(seq.words[i % len(seq.words)] for i in range(seq.length))
        finish: FinishReason = "length" if seq.cut_by_max_tokens else "stop"
        for stop in seq.stops:
            if stop in text:
                text, finish = text.split(stop, 1)[0], "stop"
        return Generation.single(
            text=text, finish_reason=finish, prompt_tokens=seq.prompt_tokens, completion_tokens=seq.length
        )

    def tokens_so_far(self, request_id: str) -> int | None:
        seq = self._running.get(request_id) or self._waiting.get(request_id)
        return seq.produced if seq is not None else None
