"""The CPU engine's logits processors for OpenAI's penalties and logit_bias (OpenAI's formulas)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gpu_worker.engines.processors import LogitBias, PresenceFrequencyPenalty  # noqa: E402


def test_penalties_follow_openais_formula_over_the_generated_tokens_only():
    # GIVEN a prompt of token 3 and a completion so far of tokens 1, 1, 2
    ids = torch.tensor([[3, 1, 1, 2]])
    scores = torch.zeros((1, 5))
    # WHEN presence 0.5 and frequency 0.25 apply
    out = PresenceFrequencyPenalty(presence=0.5, frequency=0.25, prompt_len=1)(ids, scores)
    # THEN logit[j] -= count[j] * 0.25 + (count[j] > 0) * 0.5, the prompt's token 3 untouched
    assert out.tolist() == [[0.0, -1.0, -0.75, 0.0, 0.0]]


def test_logit_bias_adds_to_the_named_tokens():
    out = LogitBias({1: -100.0, 4: 2.5})(None, torch.ones((1, 5)))
    assert out.tolist() == [[1.0, -99.0, 1.0, 1.0, 3.5]]
