"""The batch sizing rule (cdk/capacity.py)."""

from __future__ import annotations

import pytest

from cdk.capacity import A10G, QWEN2_5_1_5B, kv_cache_tokens, max_num_seqs, percentile_tokens


def test_kv_bytes_per_token_of_qwen2_5_1_5b():
    # GIVEN 28 layers, 2 KV heads of 128 in BF16 WHEN sized THEN K and V take 28 KiB a token
    assert QWEN2_5_1_5B.kv_bytes_per_token() == 2 * 28 * 2 * 128 * 2 == 28672


def test_full_context_sequences_explain_the_stack_default_of_16():
    # GIVEN an A10G at vLLM's 0.9 utilisation WHEN every sequence may reach the model's 32,768 tokens THEN about 17
    assert 16 <= max_num_seqs(QWEN2_5_1_5B, A10G, sequence_tokens=32768) <= 18


def test_sizing_on_the_workload_gives_a_batch_far_above_16():
    # GIVEN sequences of 4,259 tokens (the conversation trace's p99) WHEN sized THEN the cache holds ~137 of them
    assert max_num_seqs(QWEN2_5_1_5B, A10G, sequence_tokens=4259) == kv_cache_tokens(QWEN2_5_1_5B, A10G) // 4259
    assert 120 <= max_num_seqs(QWEN2_5_1_5B, A10G, sequence_tokens=4259) <= 150


def test_short_sequences_stop_at_vllm_default_ceiling():
    assert max_num_seqs(QWEN2_5_1_5B, A10G, sequence_tokens=256) == 256


def test_rule_refuses_impossible_inputs_naming_them():
    with pytest.raises(ValueError, match="sequence_tokens"):
        max_num_seqs(QWEN2_5_1_5B, A10G, sequence_tokens=40000)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_cache_tokens(QWEN2_5_1_5B, A10G, gpu_memory_utilization=1.5)


def test_percentile_of_token_counts():
    assert percentile_tokens(list(range(1, 101)), 0.99) == 99
