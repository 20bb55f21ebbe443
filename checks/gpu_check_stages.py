"""The stages of gpu_check.sh, one per process (a vLLM engine holds its GPU memory until its process exits):

    python -m checks.gpu_check_stages offline|adapter|worker   (from the repository root)

Each prints one JSON line last: ``seconds`` and ``tokens`` of the timed run (after a warm-up), or ``skipped``.
Settings come from the environment that gpu_check.sh exports (MODEL, PROMPTS, MAX_TOKENS, MAX_NUM_SEQS,
MAX_MODEL_LEN, GPU_MEMORY_UTILIZATION, DTYPE, ENFORCE_EAGER). vLLM spawns its engine process, which re-imports this
file: everything runs under the ``__main__`` guard.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time
from typing import Any


def engine_args() -> dict[str, Any]:
    args: dict[str, Any] = {
        "model": os.environ["MODEL"],
        "max_model_len": int(os.environ["MAX_MODEL_LEN"]),
        "max_num_seqs": int(os.environ["MAX_NUM_SEQS"]),
        "gpu_memory_utilization": float(os.environ["GPU_MEMORY_UTILIZATION"]),
    }
    if os.environ.get("DTYPE"):
        args["dtype"] = os.environ["DTYPE"]
    if os.environ.get("ENFORCE_EAGER") == "1":
        args["enforce_eager"] = True
    return args


def prompts() -> list[str]:
    return [p["prompt"] for p in json.load(open(os.environ["PROMPTS"]))]


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def report(stage: str, **fields: Any) -> None:
    print(json.dumps({"stage": stage, **fields}), flush=True)


def offline(max_tokens: int) -> None:
    """vLLM's own batch API: the ceiling the adapter and the worker are compared with."""
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_args())
    tok = llm.get_tokenizer()
    # The prompts exactly as the adapter builds them (chat template, no extra special tokens).
    ids = [
        tok.encode(
            tok.apply_chat_template(messages(p), add_generation_prompt=True, tokenize=False), add_special_tokens=False
        )
        for p in prompts()
    ]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.generate([{"prompt_token_ids": i} for i in ids[:4]], params)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": i} for i in ids], params)
    seconds = time.perf_counter() - t0
    report(
        "offline",
        seconds=seconds,
        tokens=sum(len(o.outputs[0].token_ids) for o in outs),
        texts=[o.outputs[0].text for o in outs],
    )


async def adapter(max_tokens: int) -> None:
    """The VllmEngine adapter, fed as the worker feeds it: every job its own request, capacity of them in flight."""
    from async_inference.schemas import ChatCompletionRequest
    from gpu_worker.engines.vllm_engine import VllmEngine

    engine = VllmEngine(**engine_args())
    await engine.start()
    requests = [
        ChatCompletionRequest(model="m", messages=messages(p), max_tokens=max_tokens, temperature=0.0)
        for p in prompts()
    ]
    await asyncio.gather(*(engine.generate(f"warm-{i}", r) for i, r in enumerate(requests[:4])))
    slots = asyncio.Semaphore(engine.capacity)

    async def one(i: int, request: ChatCompletionRequest):
        async with slots:
            return await engine.generate(f"job-{i}", request)

    t0 = time.perf_counter()
    generations = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    seconds = time.perf_counter() - t0
    report(
        "adapter",
        seconds=seconds,
        tokens=sum(g.completion_tokens for g in generations),
        texts=[g.text for g in generations],
    )
    await engine.close()


def worker(max_tokens: int) -> None:
    """The real worker process on the local stack (moto server, API, pollers): jobs in through HTTP, results out."""
    if any(importlib.util.find_spec(m) is None for m in ("moto", "standardwebhooks", "httpx2", "websockets", "tqdm")):
        report(
            "worker",
            skipped="the local stack needs moto[server], lambdas/requirements.txt and the SDK's"
            " dependencies (pip install -e .) in this Python",
        )
        return
    from async_inference_client import Client
    from async_inference_client.retry import Backoff
    from local_runtime.moto_server import free_port
    from local_runtime.stack import LocalDeployment

    env = {
        "MODEL": os.environ["MODEL"],
        "MAX_MODEL_LEN": os.environ["MAX_MODEL_LEN"],
        "MAX_NUM_SEQS": os.environ["MAX_NUM_SEQS"],
        "GPU_MEMORY_UTILIZATION": os.environ["GPU_MEMORY_UTILIZATION"],
        "RECEIVE_WAIT_S": "1",
        **{k: os.environ[k] for k in ("DTYPE", "ENFORCE_EAGER") if os.environ.get(k)},
    }
    stack = LocalDeployment(
        api_port=free_port(),
        moto_port=free_port(),
        workers=1,
        engine="vllm",
        worker_env=env,
        worker_log=sys.stderr.fileno(),
    )
    stack.start()
    try:
        api = Client(stack.api_url, next(iter(stack.api_keys)))
        body = {"model": "m", "messages": messages("Hello"), "max_tokens": 8, "temperature": 0}
        api.wait(api.submit(body).job_id, timeout_s=300)  # the engine has started once this job is done
        t0 = time.perf_counter()
        jobs = [
            api.submit({"model": "m", "messages": messages(p), "max_tokens": max_tokens, "temperature": 0})
            for p in prompts()
        ]
        every_200_ms = Backoff(initial_s=0.2, multiplier=1.0, cap_s=0.2, jitter=0.0)  # timed: poll tightly
        finals = [api.wait(j.job_id, timeout_s=300, poll=every_200_ms) for j in jobs]
        seconds = time.perf_counter() - t0
        done = [f for f in finals if f.status == "succeeded"]
        report(
            "worker",
            seconds=seconds,
            tokens=sum(f.usage.completion_tokens for f in done),
            succeeded=len(done),
            jobs=len(finals),
        )
    finally:
        stack.stop()


def main() -> None:
    stage = sys.argv[1]
    max_tokens = int(os.environ["MAX_TOKENS"])
    if stage == "offline":
        offline(max_tokens)
    elif stage == "adapter":
        asyncio.run(adapter(max_tokens))
    elif stage == "worker":
        worker(max_tokens)
    else:
        sys.exit(f"unknown stage {stage!r}: offline, adapter or worker")


if __name__ == "__main__":
    main()
