"""The CPU engine's running batch (``gpu_worker.engines.cpu``): a request's rows, the batch's KV cache, and the
sampling of each step's tokens as vLLM samples them.

A request asks for ``n`` rows (its choices). Each row carries its own generator (seeded from the request's ``seed``,
so a seeded request is reproducible whatever its batch mates), logits processors (``logit_bias``,
``repetition_penalty``, presence/frequency penalties) and warpers (``top_k``, ``min_p``); the grammar of
``response_format`` or a forced tool call comes last, for all constrained rows of a step at once, so constrained and
plain rows share one batch. Logprobs are read from the raw logits before any processing.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_worker.engines.asks import Asks, parse_tool_calls
from gpu_worker.engines.base import Completion, TokenLogprob, ToolCall, TopLogprob

if TYPE_CHECKING:
    from gpu_worker.engines.processors import GrammarMask

GREEDY_BELOW = 1e-5  # vLLM treats a temperature under this as greedy


@dataclass
class Row:
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
    own_s: float = 0.0  # seconds of engine time on this row's own work: its prefill and the steps that decoded it
    stalled_s: float = 0.0  # seconds it waited in the batch for other requests' prefills

    @property
    def plain(self) -> bool:
        """No processor or warper, which take the row's token history (the grammar keeps its own state)."""
        return not self.processors and not self.warpers

    def deliver(self, result: Completion | BaseException) -> None:
        """Answer the caller from any thread."""
        self.loop.call_soon_threadsafe(settle, self.future, result)


def settle(future: asyncio.Future[Completion], result: Completion | BaseException) -> None:
    if future.done():  # the caller was cancelled or aborted already
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


@dataclass
class Batch:
    """The running batch: its rows and their KV cache, attention mask (rows x cached columns, left-padded) and the
    position of each row's last token."""

    rows: list[Row] = field(default_factory=list)
    cache: Any = None
    mask: Any = None
    positions: Any = None
    next_ids: list[int] = field(default_factory=list)  # each row's last sampled token, fed at the next step
    joining: list[Row] = field(default_factory=list)  # rows taken from the pending ones and being prefilled

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

    def merge(self, rows: list[Row], cache: Any, mask: Any, positions: Any) -> None:
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


def new_row(
    row_id: str, index: int, asks: Asks, prompt_ids: list[int], grammar: Any, loop: asyncio.AbstractEventLoop
) -> Row:
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
    # The grammar is not among the processors: Sampler.sample_batch masks all constrained rows at once, after them, so
    # that nothing may lift a token it forbade.
    mask = GrammarMask(grammar) if grammar is not None else None
    warpers: list[Any] = []
    if asks.top_k:
        warpers.append(TopKLogitsWarper(asks.top_k))
    if asks.min_p:
        warpers.append(MinPLogitsWarper(asks.min_p))
    return Row(
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


def answer_of(completion: Completion, asks: Asks) -> Completion:
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


class Sampler:
    """The next token of every row of a batch, with the rows' own processors, the grammar masks of the constrained
    rows in one batched call, and the logprobs asked for. Runs in the decoding thread."""

    def __init__(self, *, capacity: int, vocab_size: int, decode: Callable[..., str]) -> None:
        self.capacity = capacity
        self.vocab_size = vocab_size  # the logits' width, which may exceed the tokenizer's
        self._decode = decode  # token ids -> text, under the engine's tokenizer lock
        self._bitmask: Any = None  # xgrammar's token bitmask, capacity x vocabulary, made at the first grammar
        self._token_texts: dict[int, str] = {}

    def sample_batch(self, logits: Any, rows: list[Row]) -> list[int]:
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

            xgr.apply_token_bitmask_inplace(scores, self._bitmask, vocab_size=self.vocab_size, indices=constrained)
        return [self._sample(scores[i], row, histories[i], logprobs[i]) for i, row in enumerate(rows)]

    def _mask(self) -> Any:
        """The batch's token bitmask (one row per batch row), allocated once."""
        if self._bitmask is None:
            import xgrammar as xgr

            self._bitmask = xgr.allocate_token_bitmask(self.capacity, self.vocab_size)
        return self._bitmask

    def _sample(self, scores: Any, row: Row, ids: Any, logprobs: Any) -> int:
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

    def _add_logprob(self, row: Row, token: int, logprobs: Any) -> None:
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
