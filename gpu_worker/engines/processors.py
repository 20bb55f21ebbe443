"""Logits processors for the CPU engine: OpenAI's parameters that transformers has no processor for, written as
``transformers.LogitsProcessor`` so that they sit in one list with transformers' own (repetition penalty, top-k,
min-p); and the grammar's per-row state (``GrammarMask``), whose masks the engine applies to the whole batch at once,
after each row's processors.

Each processor is called as transformers calls one, ``processor(input_ids, scores)``, on one row: ``input_ids`` is
``(1, prompt + generated)``, ``scores`` ``(1, vocabulary)``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers import LogitsProcessor


class PresenceFrequencyPenalty(LogitsProcessor):
    """OpenAI's presence and frequency penalties: ``logit[j] -= count[j] * frequency + (count[j] > 0) * presence``,
    where ``count[j]`` is how often token j was generated so far (the prompt does not count; vLLM counts the same)."""

    def __init__(self, presence: float, frequency: float, prompt_len: int) -> None:
        self.presence, self.frequency, self.prompt_len = presence, frequency, prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[0, self.prompt_len :]
        if generated.numel() == 0:
            return scores
        counts = torch.bincount(generated, minlength=scores.shape[-1])[: scores.shape[-1]].to(scores.dtype)
        # torch's operators return Tensor; FloatTensor is the name transformers' LogitsProcessor signature uses.
        return cast(
            torch.FloatTensor, scores - (counts * self.frequency + (counts > 0).to(scores.dtype) * self.presence)
        )


class LogitBias(LogitsProcessor):
    """OpenAI's ``logit_bias``: a bias added to the logits of the given token ids before sampling."""

    def __init__(self, bias: dict[int, float]) -> None:
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        biased = scores.clone()
        biased[0, self.ids] += self.values.to(scores.dtype)
        return cast(torch.FloatTensor, biased)


class GrammarMask:
    """xgrammar's grammar state for one row. The engine masks every constrained row of a step at once, as xgrammar
    documents for batches: each row's ``fill`` writes its allowed next tokens into its row of one shared bitmask, then
    one ``xgrammar.apply_token_bitmask_inplace`` over the batch's logits, with the constrained rows as ``indices``,
    gives the tokens the grammar does not allow -inf. The caller feeds each sampled token back with ``accept``.
    """

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)

    def fill(self, bitmask: torch.Tensor, index: int) -> bool:
        """Write the tokens allowed next into row ``index`` of ``bitmask``; False (nothing written, nothing to mask)
        once the grammar has terminated."""
        if self.matcher.is_terminated():
            return False
        self.matcher.fill_next_token_bitmask(bitmask, index)
        return True

    def accept(self, token: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token}, which its own mask allowed")
