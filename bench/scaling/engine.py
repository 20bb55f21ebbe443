"""vLLM's throughput on one GPU as a function of batch size and context: a roofline model, and one engine per task.

Per step, vLLM runs every decoding sequence one token and a chunk of waiting prefill (chunked prefill, up to
``max_num_batched_tokens`` tokens a step). A step reads the weights once plus every running sequence's KV cache, and
computes 2 x parameters FLOPs per token plus attention. Its time is the slower of the two at the efficiencies vLLM
reaches, plus a fixed per-step overhead (``figures.BANDWIDTH_EFFICIENCY``, ``COMPUTE_EFFICIENCY``,
``STEP_OVERHEAD_S``, calibrated on published vLLM runs: see figures.py):

    step = max((weights + kv_per_token x context_in_batch) / (bandwidth x e_bw),
               (2 P (decoding + prefill_chunk) + attention) / (flops x e_c)) + c

For Qwen2.5-1.5B on an A10G this gives 7.0 ms a step at one sequence, about 7.9 ms at 16 sequences of 1,260 tokens
(memory bound: the weights, 3.1 GB, dominate), about 10.9 ms at 64, and about 92 ms to prefill a
1,155-token prompt.

The engine is simulated as a fluid between events: while the batch does not change, each running sequence gains one
token per step and the prefill queue drains at chunk/step tokens per second; a sequence joins the batch when its
prefill ends and leaves when it has generated its tokens. The admission limit is ``max_num_seqs`` sequences and the
KV cache's tokens.

An embedding fleet's engine (``EngineModel.model`` an ``EncoderShape``) has no decode: a request is one prefill of its
input tokens (at most the model's ``max_tokens``) and nothing else; no KV cache outlives the step. Each step packs the
waiting prompts, whole, up to ``max_num_batched_tokens`` (at least one), as vLLM's scheduler fills its token budget
with several prefills; its time is the same roofline with no decoding sequence: the weights read once, 2 x parameters
FLOPs a token plus attention over the whole input (an encoder attends both ways, not the causal half), plus the
per-step overhead. That the calibrated efficiencies and overhead (vLLM decode runs of chat models) hold for vLLM's
pooling runner on a 22.7M-parameter encoder is an assumption, not a measurement: the overhead dominates its steps
(about 2.1 ms for one 256-token input of all-MiniLM-L6-v2 on an A10G, about 4.2 ms for eight).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from bench.scaling.figures import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, MAX_NUM_BATCHED_TOKENS, STEP_OVERHEAD_S
from bench.scaling.queue import Job
from cdk.capacity import ENCODERS, MODELS, EncoderShape, GpuSpec, ModelShape


def fleet_shape(model: str, kind: str) -> ModelShape | EncoderShape | None:
    """The shape the engine runs for a fleet's model: an encoder's (``cdk.capacity.ENCODERS``) for an embedding fleet,
    a decoder's (``MODELS``) for a chat fleet; None when ``cdk.capacity`` has none (the fleet cannot be simulated)."""
    return (ENCODERS if kind == "embedding" else MODELS).get(model)


@dataclass(frozen=True)
class EngineModel:
    model: ModelShape | EncoderShape
    gpu: GpuSpec
    max_num_seqs: int
    kv_cache_tokens: int
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    step_overhead_s: float = STEP_OVERHEAD_S

    def step_s(
        self, batch: int, context_tokens: float, prefill_tokens: float = 0.0, prefill_context: float = 0.0
    ) -> float:
        """Seconds for one step with ``batch`` decoding sequences holding ``context_tokens`` in all, plus
        ``prefill_tokens`` of prefill whose attention spans ``prefill_context`` tokens on average."""
        m = self.model
        read = m.weight_bytes() + m.kv_bytes_per_token() * context_tokens
        memory_s = read / (self.gpu.bandwidth_bytes_per_s * self.bandwidth_efficiency)
        q_width = m.attention_heads * m.head_dim
        flops = 2 * m.parameters * (batch + prefill_tokens)
        flops += 4 * m.layers * q_width * (context_tokens + prefill_tokens * prefill_context)
        compute_s = flops / (self.gpu.dense_bf16_flops * self.compute_efficiency)
        return max(memory_s, compute_s) + self.step_overhead_s

    @property
    def encoder(self) -> bool:
        """An embedding model's engine: prefill only, no KV cache (``kv_cache_tokens`` is not read)."""
        return isinstance(self.model, EncoderShape)

    def decode_tokens_per_s(self, batch: int, context_per_sequence: float) -> float:
        return batch / self.step_s(batch, batch * context_per_sequence)


class Engine:
    """One task's engine. ``submit`` hands it a job (admitted as soon as a sequence slot and KV room are free);
    ``on_done(job)`` runs when the job's last token is out. ``busy`` tells whether it has work (for CPU use)."""

    def __init__(
        self,
        env: simpy.Environment,
        model: EngineModel,
        on_start: Callable[[Job], None],
        on_done: Callable[[Job], None],
    ) -> None:
        self.env = env
        self.model = model
        self.on_start = on_start
        self.on_done = on_done
        self.waiting: deque[Job] = deque()
        self.prefill: deque[list] = deque()  # [job, tokens left]
        self.decoding: list[tuple[float, int, Job]] = []  # heap of (progress at which it ends, seq, job)
        self.progress = 0.0  # tokens each decoding sequence has gained since the engine started (a virtual clock)
        self.context = 0.0  # context tokens of the decoding batch
        self.kv_used = 0
        self.admitted = 0
        self.busy_s = 0.0
        self._seq = itertools.count()
        self._wake = env.event()
        self._context_at: dict[int, tuple[float, int]] = {}  # job index -> (progress at join, context at join)
        self.stopped = False
        env.process(self._run())

    @property
    def busy(self) -> bool:
        return self.admitted > 0

    def submit(self, job: Job) -> None:
        self.waiting.append(job)
        self._poke()

    def stop(self) -> None:
        self.stopped = True
        self._poke()

    def _poke(self) -> None:
        if not self._wake.triggered:
            self._wake.succeed()

    def _admit(self) -> None:
        while self.waiting and self.admitted < self.model.max_num_seqs:
            job = self.waiting[0]
            need = job.context_tokens + job.generated_tokens
            if self.admitted and not self.model.encoder and self.kv_used + need > self.model.kv_cache_tokens:
                break
            self.waiting.popleft()
            self.admitted += 1
            self.kv_used += need
            self.on_start(job)
            self.prefill.append([job, float(job.context_tokens)])

    def _run(self):
        if self.model.encoder:
            yield from self._run_encoder()
            return
        env = self.env
        while not self.stopped:
            self._admit()
            batch = len(self.decoding)
            if not batch and not self.prefill:
                self._wake = env.event()
                yield self._wake
                continue
            chunk = 0.0
            prefill_context = 0.0
            if self.prefill:
                job, left = self.prefill[0]
                chunk = min(left, max(1.0, self.model.max_num_batched_tokens - batch))
                prefill_context = job.context_tokens / 2
            step = self.model.step_s(batch, self.context, chunk, prefill_context)
            # Time to the next change: a prefill finishing, a sequence finishing, or an outside event.
            horizon = float("inf")
            if self.prefill:
                horizon = min(horizon, self.prefill[0][1] / chunk * step)
            if batch:
                horizon = min(horizon, (self.decoding[0][0] - self.progress) * step)
            horizon = max(horizon, 1e-6)
            self._wake = env.event()
            start = env.now
            yield env.timeout(horizon) | self._wake
            elapsed = env.now - start
            self.busy_s += elapsed
            steps = elapsed / step
            if batch:
                self.progress += steps
                self.context += batch * steps
            if self.prefill:
                self.prefill[0][1] -= chunk * steps
                if self.prefill[0][1] <= 1e-6:
                    job, _ = self.prefill.popleft()
                    if job.first_token_s is None:
                        job.first_token_s = env.now
                    # The prefill step produced the first token; the rest come one a step.
                    end = self.progress + max(0, job.generated_tokens - 1)
                    heapq.heappush(self.decoding, (end, next(self._seq), job))
                    self.context += job.context_tokens + 1
                    self._context_at[job.index] = (self.progress, job.context_tokens + 1)
            while self.decoding and self.decoding[0][0] <= self.progress + 1e-9:
                _, _, job = heapq.heappop(self.decoding)
                joined, context = self._context_at.pop(job.index)
                self.context -= context + (self.progress - joined)
                self.admitted -= 1
                self.kv_used -= job.context_tokens + job.generated_tokens
                self.on_done(job)
            if not self.decoding:
                self.context = 0.0

    def _run_encoder(self):
        """An embedding engine's steps: the admitted prompts, whole and in order, up to the token budget a step (at
        least one); each is done, its embedding out, when its step ends. Jobs that arrive during a step wait for the
        next (vLLM schedules between steps)."""
        env = self.env
        while not self.stopped:
            self._admit()
            if not self.prefill:
                self._wake = env.event()
                yield self._wake
                continue
            jobs = [self.prefill.popleft()[0]]
            tokens = jobs[0].context_tokens
            while self.prefill and tokens + self.prefill[0][0].context_tokens <= self.model.max_num_batched_tokens:
                jobs.append(self.prefill.popleft()[0])
                tokens += jobs[-1].context_tokens
            # Attention spans each prompt's own length: the step's sum of length^2, over its tokens.
            span = sum(job.context_tokens**2 for job in jobs) / tokens
            step = self.model.step_s(0, 0.0, tokens, span)
            yield env.timeout(step)
            self.busy_s += step
            if self.stopped:
                return  # the drain timed out and gave the held jobs back to the queue
            for job in jobs:
                job.first_token_s = env.now
                self.admitted -= 1
                self.kv_used -= job.context_tokens + job.generated_tokens
                self.on_done(job)
