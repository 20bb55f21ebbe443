"""Logits processors for the CPU engine: OpenAI's parameters that transformers has no processor for, written as
``transformers.LogitsProcessor`` so that they sit in one list with transformers' own (repetition penalty, top-k,
min-p) and xgrammar's grammar mask.

Each is called as transformers calls a processor, ``processor(input_ids, scores)``, on one row: ``input_ids`` is
``(1, prompt + generated)``, ``scores`` ``(1, vocabulary)``.
"""

from __future__ import annotations

from typing import Any

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
        return scores - (counts * self.frequency + (counts > 0).to(scores.dtype) * self.presence)


class LogitBias(LogitsProcessor):
    """OpenAI's ``logit_bias``: a bias added to the logits of the given token ids before sampling."""

    def __init__(self, bias: dict[int, float]) -> None:
        self.ids = torch.tensor(list(bias), dtype=torch.long)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        scores[0, self.ids] += self.values.to(scores.dtype)
        return scores


class GrammarMask(LogitsProcessor):
    """xgrammar's grammar on one row: tokens the grammar does not allow next get -inf. The caller feeds each sampled
    token back with ``accept`` (the processor is called before sampling, so it cannot see the token it let through).
    """

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.matcher.is_terminated():
            self.matcher.fill_next_token_bitmask(self.bitmask, 0)
            self._xgr.apply_token_bitmask_inplace(scores, self.bitmask)
        return scores

    def accept(self, token: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token}, which its own mask allowed")
