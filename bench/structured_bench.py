"""The cost of structured output on the CPU engine: the same prompts with ``response_format`` json_schema (xgrammar's
mask on every step) against unconstrained, in one run (``make bench``'s structured_output_speed_ratio; ``python -m
bench.run --only-structured`` runs it alone).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

from async_inference.schemas import ChatCompletionRequest

# The structured run's schema: one free-text field longer than max_tokens can fill, so that constrained and
# unconstrained answers both run to max_tokens and the ratio measures the grammar's cost per token at the same batch
# size. Without minLength 12 of 32 answers closed their JSON early (2026-12-02), the batch shrank, and the tokens/s
# ratio counted the shorter outputs against the grammar (a smaller batch's step costs almost as much).
ANSWER_MIN_CHARS = 2000
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": ANSWER_MIN_CHARS}},
    "required": ["answer"],
    "additionalProperties": False,
}


def structured_run(prompts: list[str], max_tokens: int, rounds: int = 4) -> dict[str, Any]:
    """CPU engine, one instance: the same prompts, greedy, with the same max_tokens, unconstrained and with
    response_format json_schema, each batch at once (the engine batches up to its capacity). Each round runs the two
    batches back to back, the order alternating from round to round (plain first, then structured first), so that a
    drift in the machine's speed falls on both alike; a round's ratio is its structured tokens/s over its plain
    tokens/s, and the figure is the median of the rounds' ratios (the pooled ratio and every round's are kept beside
    it, with the load average, to judge the run by). Both kinds are warmed up at full batch before timing; the first
    request with the schema (xgrammar's tokenizer info and the grammar's compile, once per schema) is timed apart."""
    from gpu_worker.engines import make_engine

    engine = make_engine("cpu")
    base = {"model": "SmolLM2-135M-Instruct", "max_tokens": max_tokens, "temperature": 0}
    structured_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
    }
    plain = [
        ChatCompletionRequest.model_validate({**base, "messages": [{"role": "user", "content": p}]}) for p in prompts
    ]
    structured = [
        ChatCompletionRequest.model_validate(
            {**base, "messages": [{"role": "user", "content": p}], "response_format": structured_format}
        )
        for p in prompts
    ]
    kinds = {"plain": plain, "structured": structured}
    totals: dict[str, list[float]] = {"plain": [0, 0.0, 0], "structured": [0, 0.0, 0]}  # tokens, s, cut
    round_ratios: list[float] = []

    async def timed(kind: str, round_: int) -> float:
        start = time.perf_counter()
        outputs = await asyncio.gather(*(engine.generate(f"{kind}-{round_}-{i}", r) for i, r in enumerate(kinds[kind])))
        elapsed = time.perf_counter() - start
        tokens = sum(o.completion_tokens for o in outputs)
        totals[kind][0] += tokens
        totals[kind][1] += elapsed
        totals[kind][2] += sum(o.finish_reason == "length" for o in outputs)
        return tokens / elapsed

    async def run() -> float:
        await engine.start()
        start = time.perf_counter()
        await engine.generate("compile", structured[0].model_copy(update={"max_tokens": 4}))
        compile_s = time.perf_counter() - start
        for kind, batch in kinds.items():  # warm-up: a full batch of each, a few tokens
            await asyncio.gather(
                *(
                    engine.generate(f"warm-{kind}-{i}", r.model_copy(update={"max_tokens": 4}))
                    for i, r in enumerate(batch)
                )
            )
        for round_ in range(rounds):
            order = ["plain", "structured"] if round_ % 2 == 0 else ["structured", "plain"]
            rates = {kind: await timed(kind, round_) for kind in order}
            round_ratios.append(rates["structured"] / rates["plain"])
        await engine.close()
        return compile_s

    load_before = os.getloadavg()
    loop = asyncio.new_event_loop()
    compile_s = loop.run_until_complete(run())
    loop.close()
    plain_rate = totals["plain"][0] / totals["plain"][1]
    structured_rate = totals["structured"][0] / totals["structured"][1]
    return {
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "rounds": rounds,
        "first_request_with_the_schema_s": round(compile_s, 3),
        "plain_tokens": totals["plain"][0],
        "plain_s": round(totals["plain"][1], 3),
        "plain_cut_by_max_tokens": totals["plain"][2],
        "plain_tokens_per_s": plain_rate,
        "structured_tokens": totals["structured"][0],
        "structured_s": round(totals["structured"][1], 3),
        "structured_cut_by_max_tokens": totals["structured"][2],
        "structured_tokens_per_s": structured_rate,
        "round_ratios": [round(r, 4) for r in round_ratios],
        "ratio": statistics.median(round_ratios),
        "ratio_pooled": structured_rate / plain_rate,
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
