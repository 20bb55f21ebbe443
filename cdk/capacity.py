"""How many sequences one vLLM task should batch: a sizing rule from the model's shape and the GPU's memory.

vLLM keeps every running sequence's keys and values in a KV cache that takes what GPU memory the weights and the
engine's own working memory leave. ``max_num_seqs`` caps how many sequences run at once; set far below what the cache
holds, it caps a task's throughput (the decode step reads the weights once per step, whatever the batch); set above
it, vLLM preempts sequences when the cache fills. The rule:

    kv_cache_bytes = gpu_memory x gpu_memory_utilization - weight_bytes - reserve_bytes
    kv_bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x kv_dtype_bytes
    max_num_seqs = min(ceiling, floor(kv_cache_bytes / kv_bytes_per_token / sequence_tokens))

where ``sequence_tokens`` is the context a sequence is planned to reach (prompt plus output; a high percentile of the
workload, not the model's maximum: vLLM preempts the rare longer one rather than failing it) and ``ceiling`` is
vLLM's own default (256 on GPUs under 70 GiB). Nothing here imports aws_cdk: the stack and the scaling simulator
(``bench.scaling``) both read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a decoder-only transformer that set its memory and compute per token."""

    name: str
    parameters: float
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    max_position_embeddings: int

    def weight_bytes(self, dtype_bytes: int = 2) -> float:
        return self.parameters * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: memory as the driver reports it, peak memory bandwidth and peak dense BF16 tensor throughput."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    dense_bf16_flops: float


# Qwen2.5-1.5B-Instruct, from its model card (huggingface.co/Qwen/Qwen2.5-1.5B-Instruct: 1.54B parameters, 28 layers,
# 12 query and 2 KV heads, 32,768-token context) and config.json (hidden_size 1536, so head_dim 128).
QWEN2_5_1_5B = ModelShape(
    name="Qwen/Qwen2.5-1.5B-Instruct",
    parameters=1.54e9,
    layers=28,
    hidden_size=1536,
    attention_heads=12,
    kv_heads=2,
    head_dim=128,
    max_position_embeddings=32768,
)
# SmolLM2-135M-Instruct, from its config.json (30 layers, hidden_size 576, 9 query and 3 KV heads of head_dim 64,
# 8,192-token context) and its weights: the tensors of model.safetensors hold 134,515,008 parameters (embeddings tied
# to the output head; the model card, huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct, says 135M).
SMOLLM2_135M = ModelShape(
    name="HuggingFaceTB/SmolLM2-135M-Instruct",
    parameters=134_515_008,
    layers=30,
    hidden_size=576,
    attention_heads=9,
    kv_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
)
MODELS: dict[str, ModelShape] = {shape.name: shape for shape in (QWEN2_5_1_5B, SMOLLM2_135M)}


@dataclass(frozen=True)
class EncoderShape:
    """The dimensions of an encoder (an embedding model): one forward pass over the input, no decode and no KV cache
    kept between steps, so the sizing rule above does not apply (an embedding fleet sets its ``max_num_seqs``).
    ``max_tokens`` is what the model embeds of an input (longer inputs are truncated)."""

    name: str
    parameters: float
    layers: int
    hidden_size: int
    attention_heads: int
    max_tokens: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.attention_heads

    def weight_bytes(self, dtype_bytes: int = 2) -> float:
        return self.parameters * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 0  # nothing is kept between steps


# all-MiniLM-L6-v2, from its config.json (a BERT encoder: 6 layers, hidden_size 384, 12 heads) and
# sentence_bert_config.json (max_seq_length 256: longer inputs are truncated); the tensors of model.safetensors hold
# 22,713,728 parameters (the model card, huggingface.co/sentence-transformers/all-MiniLM-L6-v2, says 22.7M).
MINILM_L6_V2 = EncoderShape(
    name="sentence-transformers/all-MiniLM-L6-v2",
    parameters=22_713_728,
    layers=6,
    hidden_size=384,
    attention_heads=12,
    max_tokens=256,
)
ENCODERS: dict[str, EncoderShape] = {MINILM_L6_V2.name: MINILM_L6_V2}

# NVIDIA A10G (the g5 family's GPU): 24 GB GDDR6 at 600 GB/s and 70 dense FP16/BF16 tensor TFLOPS (Baseten, "NVIDIA A10
# vs A10G for ML model inference", spec table); nvidia-smi on a g5 reports 23,028 MiB of it.
A10G = GpuSpec(name="A10G", memory_bytes=23028 * MIB, bandwidth_bytes_per_s=600e9, dense_bf16_flops=70e12)
# GPUs per instance type (AWS EC2 accelerated computing instances: g5.xlarge to g5.8xlarge have one A10G).
INSTANCE_GPUS: dict[str, tuple[GpuSpec, int]] = {
    "g5.xlarge": (A10G, 1),
    "g5.2xlarge": (A10G, 1),
    "g5.4xlarge": (A10G, 1),
    "g5.8xlarge": (A10G, 1),
}

# vLLM's gpu_memory_utilization default (EngineArgs).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# vLLM's max_num_seqs default on GPUs under 70 GiB (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults).
VLLM_DEFAULT_MAX_NUM_SEQS = 256
# The context a sequence is planned to reach when nothing else is said: the 99th percentile of prompt + output tokens
# of the Azure LLM inference conversation trace (2023, 19,366 requests), 4,259 (tests/scaling/test_capacity.py
# recomputes it from the trace). It gives 135 sequences for Qwen2.5-1.5B on an A10G.
DEFAULT_SEQUENCE_TOKENS = 4259
# GPU memory vLLM holds outside weights and KV cache: CUDA graphs (0.48 GiB in the startup log of vllm-project/vllm#20264)
# plus the activation peak of its profiling run and the CUDA context. That log (a 3.4 GiB model, 613,024 KV tokens of
# 112 KiB on an 80 GB GPU at 0.9) leaves about 2.3 GiB; 2 GiB for this smaller model. One GiB more or less moves
# max_num_seqs by about 9 at 4,259 tokens a sequence.
DEFAULT_RESERVE_BYTES = 2 * GIB


def kv_cache_bytes(
    model: ModelShape,
    gpu: GpuSpec,
    *,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    weight_dtype_bytes: int = 2,
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
) -> float:
    """GPU memory left for the KV cache once vLLM has loaded the weights and set aside its working memory."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization ({gpu_memory_utilization}) must lie in (0, 1]")
    left = gpu.memory_bytes * gpu_memory_utilization - model.weight_bytes(weight_dtype_bytes) - reserve_bytes
    if left <= 0:
        raise ValueError(
            f"{model.name} ({model.weight_bytes(weight_dtype_bytes) / GIB:.1f} GiB of weights) leaves no KV cache on "
            f"{gpu.name} at gpu_memory_utilization {gpu_memory_utilization}"
        )
    return left


def kv_cache_tokens(model: ModelShape, gpu: GpuSpec, *, kv_dtype_bytes: int = 2, **memory: float) -> int:
    """Tokens (over all sequences) the KV cache holds."""
    return int(kv_cache_bytes(model, gpu, **memory) // model.kv_bytes_per_token(kv_dtype_bytes))


def max_num_seqs(
    model: ModelShape,
    gpu: GpuSpec,
    *,
    sequence_tokens: int,
    ceiling: int = VLLM_DEFAULT_MAX_NUM_SEQS,
    kv_dtype_bytes: int = 2,
    **memory: float,
) -> int:
    """Sequences one engine should batch so that each can reach ``sequence_tokens`` in the KV cache (the rule above)."""
    if sequence_tokens < 1:
        raise ValueError(f"sequence_tokens ({sequence_tokens}) must be at least 1")
    if sequence_tokens > model.max_position_embeddings:
        raise ValueError(
            f"sequence_tokens ({sequence_tokens}) exceeds {model.name}'s context ({model.max_position_embeddings})"
        )
    fits = kv_cache_tokens(model, gpu, kv_dtype_bytes=kv_dtype_bytes, **memory) // sequence_tokens
    if fits < 1:
        raise ValueError(f"one sequence of {sequence_tokens} tokens does not fit {model.name}'s KV cache on {gpu.name}")
    return int(min(ceiling, fits))


def percentile_tokens(token_counts: list[int], quantile: float = 0.99) -> int:
    """The ``quantile`` of a workload's per-request context (prompt plus output), the rule's ``sequence_tokens``."""
    if not token_counts:
        raise ValueError("no requests to size for")
    ordered = sorted(token_counts)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))]


def sized_max_num_seqs(model: str, instance_type: str, *, sequence_tokens: int = DEFAULT_SEQUENCE_TOKENS) -> int:
    """The rule's ``max_num_seqs`` for a model and an instance type named in ``MODELS`` and ``INSTANCE_GPUS``;
    KeyError naming the one that is not there."""
    if model not in MODELS:
        raise KeyError(f"no shape for model {model!r} in cdk.capacity.MODELS (known: {', '.join(MODELS)})")
    if instance_type not in INSTANCE_GPUS:
        raise KeyError(
            f"no GPU for instance type {instance_type!r} in cdk.capacity.INSTANCE_GPUS "
            f"(known: {', '.join(INSTANCE_GPUS)})"
        )
    return max_num_seqs(MODELS[model], INSTANCE_GPUS[instance_type][0], sequence_tokens=sequence_tokens)
