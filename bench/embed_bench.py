"""The embedding figures of ``make bench`` (bench/run.py): a batch of ``/v1/embeddings`` lines through the whole
pipeline against the same model called directly, side by side in one run, on the real all-MiniLM-L6-v2 on the CPU.

- direct: the CPU embedding engine (``gpu_worker.engines.cpu_embedding``) given the same texts as
  sentence-transformers' ``model.encode(sentences)`` runs them (sorted by length, batches of 32, one forward pass
  each), with no queue, no S3 and no table;
- pipeline: the same texts as the lines of one batch, created by the API side (``BatchService``: the file upload and
  the batch create), planned and finalized by the template's controller code, run by one worker with the batch lane
  and the same engine, from the file upload to the batch's final record (its output file written);
- embedding_pipeline_ratio: direct seconds over pipeline seconds (the goal is at least 0.8); the direct run is timed
  before and after the pipeline run and their mean is used, so that the machine's other load moves both sides;
- embedding_requests_per_line: AWS requests per line end to end (the API side, the controller and the worker),
  counted at the botocore level as the chat batch's are.

Each side's engine is started (the model loaded) before its clock starts; each run has an engine of its own.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from async_inference.batches.models import BatchCreate, BatchStatus
from async_inference.schemas import EMBEDDINGS_ENDPOINT
from bench.batch_bench import API_THREAD, CONTROLLER_THREAD, TENANT, BatchBench, in_thread
from gpu_worker.engines.cpu_embedding import (
    MINILM_NAME,
    CpuEmbeddingEngine,
    resolve_embedding_model_dir,
)

TEXT_CHARS = 400  # about 100 tokens of English, as a chunk of a document would be
DIRECT_BATCH_SIZE = 32  # sentence-transformers' encode(batch_size=32), its default
MAX_TOKENS = 250  # inside the model's 256 with room for the cycled texts' suffix


def embedding_texts(prompts: list[str], count: int) -> list[str]:
    """``count`` texts: the prompts cut to TEXT_CHARS, those within the model's input length (code and some scripts
    take many more tokens a character), cycled with their index so that no two lines are equal."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_embedding_model_dir(None))
    cut = [p[:TEXT_CHARS] for p in prompts if p.strip()]
    cut = [c for c, ids in zip(cut, tokenizer(cut)["input_ids"], strict=True) if len(ids) <= MAX_TOKENS]
    return [cut[i] if i < len(cut) else f"{cut[i % len(cut)]} ({i})" for i in range(count)]


def direct_run(texts: list[str]) -> dict[str, Any]:
    """The texts through a started engine as sentence-transformers' ``encode`` runs a list (its documented way to
    embed a corpus): sorted by length, longest first, in batches of its default ``batch_size`` of 32, so that each
    forward pass pads little. The model is loaded before the clock starts."""

    async def run() -> tuple[int, float]:
        engine = CpuEmbeddingEngine()
        await engine.start()
        ordered = sorted(texts, key=len, reverse=True)
        began, tokens = time.perf_counter(), 0
        for start in range(0, len(ordered), DIRECT_BATCH_SIZE):
            embedded = await engine.embed(f"direct-{start}", ordered[start : start + DIRECT_BATCH_SIZE])
            tokens += embedded.prompt_tokens
        elapsed = time.perf_counter() - began
        await engine.close()
        return tokens, elapsed

    load = os.getloadavg()[0]
    tokens, elapsed = asyncio.run(run())
    return {"texts": len(texts), "tokens": tokens, "elapsed_s": round(elapsed, 3), "load_average": load}


def pipeline_run(bench: BatchBench, texts: list[str], counter: Any) -> dict[str, Any]:
    """The texts as one batch of /v1/embeddings lines: uploaded and created by the API side, planned and finalized
    by the controller (a thread here, as batch_bench plays the paused mapping), run by one worker."""
    lines = [
        {
            "custom_id": f"emb-{i}",
            "method": "POST",
            "url": EMBEDDINGS_ENDPOINT,
            "body": {"model": MINILM_NAME, "input": t},
        }
        for i, t in enumerate(texts)
    ]
    counter.reset()
    load = os.getloadavg()[0]
    engine = CpuEmbeddingEngine()
    with bench.worker(engine):
        deadline = time.monotonic() + 300
        while not engine.dimension and time.monotonic() < deadline:  # the worker loads the model at its start
            time.sleep(0.2)
        time.sleep(1.0)  # the worker is polling before the clock starts, as a running fleet is
        began = time.perf_counter()
        batch_id = in_thread(API_THREAD, lambda: _create(bench, lines))
        controlled: dict[str, Any] = {}

        def control() -> None:
            try:
                controlled["record"] = bench.control_until_final(batch_id, timeout_s=1800)
            except BaseException as exc:  # reported below
                controlled["error"] = exc

        controller = threading.Thread(name=CONTROLLER_THREAD, target=control)
        controller.start()
        controller.join()
        elapsed = time.perf_counter() - began
    if "record" not in controlled:
        raise RuntimeError(f"the controller failed: {controlled.get('error')!r}")
    final = controlled["record"]
    if final.status is not BatchStatus.COMPLETED or final.completed != len(texts):
        raise RuntimeError(f"the embedding batch ended {final.status.value}: {final.completed} of {len(texts)} lines")
    sides = {side: counter.total(side) for side in ("batch_api", "batch_controller", "worker")}
    return {
        "lines": len(texts),
        "chunks": final.chunk_count,
        "elapsed_s": round(elapsed, 3),
        "load_average": load,
        "api_requests": sides["batch_api"],
        "controller_requests": sides["batch_controller"],
        "worker_requests": sides["worker"],
        "requests_per_line": sum(sides.values()) / len(texts),
        "by_operation": {f"{side}:{op}": n for (side, op), n in sorted(counter.counts.items())},
    }


def _create(bench: BatchBench, lines: list[dict[str, Any]]) -> str:
    import json

    data = ("\n".join(json.dumps(line) for line in lines) + "\n").encode()
    file = bench.service.create_file(TENANT, filename="embeddings.jsonl", purpose="batch", data=data)
    return bench.service.create_batch(
        TENANT, BatchCreate(input_file_id=file.id, endpoint=EMBEDDINGS_ENDPOINT, completion_window="24h")
    ).id


def embedding_runs(bench: BatchBench, texts: list[str], counter: Any) -> dict[str, Any]:
    """Direct, pipeline, direct again; the ratio of the directs' mean to the pipeline."""
    print(f"embeddings: {len(texts)} texts of up to {TEXT_CHARS} characters, {MINILM_NAME} on the CPU", flush=True)
    before = direct_run(texts)
    print(f"  direct (sorted by length, batches of {DIRECT_BATCH_SIZE}): {before['elapsed_s']:.1f} s", flush=True)
    pipeline = pipeline_run(bench, texts, counter)
    print(
        f"  pipeline (a batch of {len(texts)} lines, {pipeline['chunks']} chunks): {pipeline['elapsed_s']:.1f} s, "
        f"{pipeline['requests_per_line']:.3f} AWS requests per line",
        flush=True,
    )
    after = direct_run(texts)
    print(f"  direct again: {after['elapsed_s']:.1f} s", flush=True)
    direct_s = (before["elapsed_s"] + after["elapsed_s"]) / 2
    ratio = direct_s / pipeline["elapsed_s"]
    print(f"  pipeline at {ratio:.3f} of the model called directly (goal 0.8)", flush=True)
    return {
        "summary": {
            "embedding_pipeline_ratio": round(ratio, 4),
            "embedding_lines_per_s": round(len(texts) / pipeline["elapsed_s"], 2),
            "embedding_direct_texts_per_s": round(len(texts) / direct_s, 2),
            "embedding_requests_per_line": round(pipeline["requests_per_line"], 4),
        },
        "direct_before": before,
        "pipeline": pipeline,
        "direct_after": after,
    }
