"""The embedding part of ``checks.vllm_cpu_check``: the VllmEmbeddingEngine adapter (vLLM's pooling runner) on
all-MiniLM-L6-v2 (the CPU embedding engine's extracted copy of the packaged model), against the CPU embedding engine
(transformers) on the same files. Checks that:
  - the vectors have the model's 384 dimensions and match the transformers reference (cosine > 0.999 each);
  - a paraphrase is closer than unrelated text;
  - usage.prompt_tokens is the reference's count (the model's tokens with [CLS] and [SEP]);
  - dimensions other than the model's own is refused naming ``dimensions`` (MiniLM is not a Matryoshka model);
  - an input over the model's length is refused, not cut.

Run alone: ``.venv-vllm/bin/python -m checks.vllm_cpu_embedding_check`` (vLLM spawns its engine in a child process
that re-imports the main module: everything runs under the ``__main__`` guard).
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections.abc import Callable

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

from gpu_worker.engines.base import PermanentEngineError  # noqa: E402

TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply this morning."]
# See checks.vllm_cpu_check: on the CPU backend this is the share of the node's memory that must be free at start.
MEMORY_UTILIZATION = 0.2


def cosine(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def check_embedding(check: Callable[[str, bool, str], None]) -> None:
    from gpu_worker.engines.cpu_embedding import CpuEmbeddingEngine, prepare_minilm
    from gpu_worker.engines.vllm_embedding import VllmEmbeddingEngine

    model_dir = prepare_minilm()
    reference_engine = CpuEmbeddingEngine(str(model_dir))
    await reference_engine.start()
    reference = await reference_engine.embed("ref", TEXTS)
    await reference_engine.close()

    engine = VllmEmbeddingEngine(
        model=str(model_dir),
        served_model_name="all-MiniLM-L6-v2",
        dtype="float32",
        enforce_eager=True,
        max_num_seqs=8,
        gpu_memory_utilization=MEMORY_UTILIZATION,
    )
    t0 = time.monotonic()
    await engine.start()
    print(f"vllm pooling runner started in {time.monotonic() - t0:.1f} s", flush=True)
    try:
        got = await engine.embed("e1", TEXTS)
        check("embedding: 384 dimensions", engine.dimension == 384 and all(len(v) == 384 for v in got.vectors), "")
        similarities = [cosine(a, b) for a, b in zip(got.vectors, reference.vectors, strict=True)]
        check(
            "embedding: vectors match the transformers reference",
            min(similarities) > 0.999,
            f"cosines {[round(s, 5) for s in similarities]}",
        )
        closer = cosine(got.vectors[0], got.vectors[1]) > cosine(got.vectors[0], got.vectors[2]) + 0.3
        check("embedding: a paraphrase is closer than unrelated text", closer, "")
        check(
            "embedding: prompt_tokens as the reference counts them",
            got.prompt_tokens == reference.prompt_tokens,
            f"{got.prompt_tokens} vs {reference.prompt_tokens}",
        )
        try:
            await engine.embed("e2", ["text"], dimensions=64)
            check("embedding: dimensions 64 refused", False, "accepted")
        except PermanentEngineError as exc:
            check("embedding: dimensions 64 refused", str(exc).startswith("dimensions:"), str(exc)[:120])
        try:
            await engine.embed("e3", ["word " * 1000])
            check("embedding: an over-long input refused", False, "accepted")
        except PermanentEngineError as exc:
            check("embedding: an over-long input refused", True, str(exc)[:160])
    finally:
        await engine.close()


def main() -> int:
    failures: list[str] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        if not ok:
            failures.append(name)
        print(f"{'PASS' if ok else 'FAIL'}  {name}{'  -- ' + detail if detail else ''}", flush=True)

    asyncio.run(check_embedding(check))
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
