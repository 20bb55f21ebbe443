"""``make bench-cpu-engine``: the CPU engine's linear layers over a few rows, ``weight @ rows.T`` (``_narrow_linear``,
the engine's) against ``torch.nn.Linear``'s own ``rows @ weight.T``, side by side in one run on one loaded model.

- step_ms: a decoding step's median over 20, for 1, 2, 4 and 8 rows of a 40-token prompt, on a thread of asyncio's pool
  as the engine's decoding loop runs;
- batch_tokens_per_s: 8 requests of 64 tokens each sent together through the engine (``CpuEngine.generate``), in
  rounds that alternate which form goes first, the median of each form's rounds;
- ratios: the engine's form over ``torch.nn.Linear``'s (time for steps, tokens/s for the batch).

The two forms are switched by ``gpu_worker.engines.cpu.NARROW_ROWS`` (0: every layer falls back to ``F.linear``). Ends
with one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines import cpu

ROWS = (1, 2, 4, 8)
FORMS = {"narrow": cpu.NARROW_ROWS, "linear": 0}


def step_ms(model: Any, rows: int, steps: int = 20) -> float:
    import torch
    from transformers import DynamicCache

    with torch.inference_mode():
        ids = torch.randint(100, 1000, (rows, 40))
        mask = torch.ones((rows, 40), dtype=torch.long)
        mask[1:, :5] = 0  # left padding, as rows of different prompts have
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, logits_to_keep=1)
        positions = positions[:, -1:]
        took = []
        for _ in range(steps):
            mask, positions = torch.cat([mask, mask.new_ones((rows, 1))], 1), positions + 1
            started = time.perf_counter()
            model(
                input_ids=torch.randint(100, 1000, (rows, 1)),
                attention_mask=mask,
                position_ids=positions,
                cache=cache,
                logits_to_keep=1,
            )
            took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


async def batch_tokens_per_s(engine: cpu.CpuEngine, round_: int) -> float:
    requests = [
        ChatCompletionRequest.model_validate(
            {
                "model": "SmolLM2-135M-Instruct",
                "messages": [{"role": "user", "content": f"Write a story about the number {round_ * 8 + i}."}],
                "max_tokens": 64,
                "temperature": 0,
            }
        )
        for i in range(8)
    ]
    started = time.monotonic()
    generations = await asyncio.gather(*(engine.generate(f"r{round_}-{i}", r) for i, r in enumerate(requests)))
    return sum(g.completion_tokens for g in generations) / (time.monotonic() - started)


async def main() -> dict[str, Any]:
    engine = cpu.CpuEngine(capacity=8)
    await engine.start()
    steps: dict[str, dict[int, float]] = {form: {} for form in FORMS}
    rates: dict[str, list[float]] = {form: [] for form in FORMS}
    try:
        for rows in ROWS:
            for form, most in FORMS.items():
                cpu.NARROW_ROWS = most
                # on a thread of the default pool, as the engine's decoding loop runs
                steps[form][rows] = await asyncio.to_thread(step_ms, engine._model, rows)
            print(
                f"{rows} rows: a step {steps['narrow'][rows]:.1f} ms, with torch.nn.Linear {steps['linear'][rows]:.1f} ms"
            )
        for round_ in range(4):
            order = list(FORMS) if round_ % 2 == 0 else list(reversed(FORMS))
            for form in order:
                cpu.NARROW_ROWS = FORMS[form]
                rates[form].append(await batch_tokens_per_s(engine, round_))
    finally:
        cpu.NARROW_ROWS = FORMS["narrow"]
        await engine.close()
    narrow, linear = statistics.median(rates["narrow"]), statistics.median(rates["linear"])
    print(f"8 x 64 tokens: {narrow:.1f} tokens/s, with torch.nn.Linear {linear:.1f} tokens/s")
    return {
        "step_ms": {form: {str(r): round(ms, 1) for r, ms in by_rows.items()} for form, by_rows in steps.items()},
        "step_time_ratio": {str(r): round(steps["narrow"][r] / steps["linear"][r], 2) for r in ROWS},
        "batch_tokens_per_s": {"narrow": round(narrow, 1), "linear": round(linear, 1)},
        "batch_speedup": round(narrow / linear, 2),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
