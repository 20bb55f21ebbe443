"""The batch sizing rule (cdk/capacity.py)."""

from __future__ import annotations

import pytest

from cdk.capacity import (
    A10G,
    ENCODERS,
    MINILM_L6_V2,
    MODELS,
    QWEN2_5_1_5B,
    SMOLLM2_135M,
    kv_cache_tokens,
    max_num_seqs,
    percentile_tokens,
    sized_max_num_seqs,
)


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


def test_smollm2_135m_shape_sizes_from_its_config():
    # GIVEN SmolLM2-135M's 30 layers and 3 KV heads of 64 in BF16 WHEN sized THEN K and V take 22.5 KiB a token, and
    # its 0.27 GB of weights leave an A10G's cache about 196 sequences of 4,259 tokens (102 at its full 8,192)
    assert SMOLLM2_135M.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 2 == 23040
    assert MODELS[SMOLLM2_135M.name] is SMOLLM2_135M
    assert max_num_seqs(SMOLLM2_135M, A10G, sequence_tokens=4259) == kv_cache_tokens(SMOLLM2_135M, A10G) // 4259
    assert 180 <= max_num_seqs(SMOLLM2_135M, A10G, sequence_tokens=4259) <= 210
    assert sized_max_num_seqs(SMOLLM2_135M.name, "g5.xlarge", sequence_tokens=8192) == min(
        256, kv_cache_tokens(SMOLLM2_135M, A10G) // 8192
    )


def test_an_encoder_is_not_sized_by_the_kv_rule():
    # GIVEN all-MiniLM-L6-v2 (an encoder, in ENCODERS) WHEN the stack would size its batch THEN the rule refuses it by
    # name (an embedding fleet sets max_num_seqs): the encoder keeps no KV cache
    assert MINILM_L6_V2.kv_bytes_per_token() == 0 and MINILM_L6_V2.head_dim == 32
    assert MINILM_L6_V2.name not in MODELS and ENCODERS[MINILM_L6_V2.name] is MINILM_L6_V2
    with pytest.raises(KeyError, match="all-MiniLM-L6-v2"):
        sized_max_num_seqs(MINILM_L6_V2.name, "g5.xlarge")
