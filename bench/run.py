"""``make bench``: how well the pipeline feeds the engine, each figure a ratio measured side by side in one run.

- engine_utilisation: a backlog through the local stack into the simulated engine (capacity 64, fixed step time):
  tokens/s achieved divided by the engine's ceiling (capacity / step time).
- one_at_a_time_utilisation: the same kind of jobs through a worker that holds one message at a time.
- pipeline_efficiency: CPU engine, ShareGPT prompts: tokens/s through the whole local pipeline divided by tokens/s
  calling the same engine directly on the same prompts.
- requests_per_job: AWS requests (counted at the botocore level, API side and worker side) per job at backlog.
- idle_pickup_p50_s: submit to generation start with an idle, long-polling worker, median.
- structured_output_speed_ratio: CPU engine, the same prompts with the same max_tokens generated with response_format
  json_schema (xgrammar's mask on every step) and unconstrained, in one run, in rounds that alternate which goes
  first: the median of the rounds' structured tokens/s divided by unconstrained tokens/s (goal: at least 0.9).
  ``--only-structured`` runs this alone, without the local stack (``--rounds`` sets the rounds).
- stream_ttft_added_p50_s, requests_per_1000_streamed_tokens: CPU engine, a warm worker: the time to first token of a
  streamed chat completion through the API less the engine's own, at p50 (goal: at most 0.5 s), and the AWS requests
  (worker and functions) per 1,000 streamed tokens (bench/stream_api.py).
- batch_requests_per_line, batch_engine_utilisation, interactive_wait_under_batch_p95_s: a 5,000-line batch through a
  worker with both lanes (bench/batch_bench.py), with the ratio of the last to its goal (2 x idle pickup + one step).

Figures go to bench/results/ (JSON and a plot); the last line printed is one JSON object with those keys.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import csv
import datetime as dt
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

from async_inference.aws import client
from async_inference.schemas import ChatCompletionRequest
from async_inference_client import Client
from bench.instruments import (
    API_KEY,
    FunctionRequests,
    RequestCounter,
    RunningWorker,
    Timed,
    queue_depth,
    submit_all,
    wait_until,
)
from bench.stream_api import stream_run
from bench.structured_bench import structured_run
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment

RESULTS = Path(__file__).resolve().parent / "results"
# /work/shared/data beside the main checkout; SHARED_DATA names it from a worktree elsewhere.
SHARED_DATA = Path(os.environ.get("SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
SHAREGPT = SHARED_DATA / "ShareGPT_V3_filtered_500_v2.json"
AZURE_TRACE = SHARED_DATA / "AzureLLMInferenceTrace_conv_2023.csv"
# The simulated GPU: 64 sequences per batch, 50 ms a decoding step (a 7B model on one A10G decodes a batch of 64 in
# about that), so the engine's ceiling is 1,280 tokens/s. Output lengths are the GeneratedTokens of the Azure LLM
# inference conversation trace (mean 211), so jobs end at staggered steps as real ones do, about 6 jobs/s at the
# ceiling. The job rate matters: moto server answers 50-100 requests/s on this machine (measured and printed by each
# run); much shorter jobs would measure the emulator, not the worker.
STEP_S = 0.05
log = logging.getLogger("bench")


# --- the measurements -----------------------------------------------------------------------------------------------


def trace_lengths(count: int) -> list[int]:
    """Output lengths of the first ``count`` requests of the Azure conversation trace."""
    with AZURE_TRACE.open() as trace:
        rows = csv.DictReader(trace)
        return [int(row["GeneratedTokens"]) for row, _ in zip(rows, range(count), strict=False)]


def utilisation_run(
    stack: LocalDeployment,
    api: Client,
    *,
    capacity: int,
    worker_capacity: int,
    lengths: list[int],
    step_s: float,
    sample: bool,
) -> dict[str, Any]:
    """A backlog of jobs with these output lengths, through a worker that lets at most ``worker_capacity`` jobs into
    a simulated engine of ``capacity`` slots."""
    from gpu_worker.engines.simulated import SimulatedEngine

    jobs = len(lengths)
    bodies = [
        {
            "model": "sim",
            "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(n))}],
            "max_tokens": n,
        }
        for n in lengths
    ]
    submit_all(api, bodies)
    engine = Timed(SimulatedEngine(capacity=capacity, step_s=step_s), capacity=worker_capacity)
    samples: list[dict[str, float]] = []
    assert stack.resources is not None
    start = time.perf_counter()
    # The one-at-a-time worker holds exactly one message: no prefetch either.
    with RunningWorker(engine, prefetch=0 if worker_capacity == 1 else None) as worker:
        while worker.jobs_finished < jobs:
            if time.perf_counter() - start > 600:
                raise TimeoutError("utilisation run did not finish")
            if sample:
                visible, in_flight = queue_depth(stack.resources.config.queue_url)
                # The engine's own counter: tokens as each decoding step produces them, not when their job ends.
                samples.append(
                    {
                        "t": time.perf_counter() - start,
                        "tokens": engine.inner.stats.tokens,
                        "visible": visible,
                        "in_flight": in_flight,
                    }
                )
                time.sleep(0.25)
            else:
                time.sleep(0.05)
        elapsed = time.perf_counter() - start
    ceiling = capacity / step_s
    return {
        "jobs": jobs,
        "tokens": engine.tokens,
        "elapsed_s": round(elapsed, 3),
        "tokens_per_s": engine.tokens / elapsed,
        "ceiling_tokens_per_s": ceiling,
        "utilisation": engine.tokens / elapsed / ceiling,
        # How full the batch was over the steps the engine ran (it runs none while idle).
        "batch_fullness": engine.inner.stats.utilisation,
        "while_backlogged": while_backlogged(samples, ceiling) if samples else None,
        "samples": samples,
    }


def emulator_rate(stack: LocalDeployment, requests: int = 200, threads: int = 8) -> float:
    """GetQueueAttributes calls per second that moto server answers with ``threads`` callers: the ceiling on any
    request rate measured here."""
    assert stack.resources is not None
    url = stack.resources.config.queue_url
    sqs = client("sqs")
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"]), range(requests)))
    return requests / (time.perf_counter() - start)


def while_backlogged(samples: list[dict[str, float]], ceiling: float) -> float | None:
    """Throughput over the engine's ceiling from the worker's start until the queue ran dry (the last sample with
    messages still visible). After that nothing is left to feed the engine: the drain tail, where the longest jobs of
    the trace finish in a nearly empty batch, measures the workload, not the worker."""
    last = max((i for i, s in enumerate(samples) if s["visible"] > 0), default=0)
    if last == 0:
        return None
    end = samples[last]
    return end["tokens"] / end["t"] / ceiling


def requests_run(stack: LocalDeployment, api: Client, counter: RequestCounter, jobs: int) -> dict[str, Any]:
    """AWS requests per job at backlog: submit ``jobs`` jobs, then let one worker run them all. The API side's are
    the API and authorizer functions' requests, recorded by moto server (``FunctionRequests``); the worker's are
    counted in this process."""
    from gpu_worker.engines.simulated import SimulatedEngine

    bodies = [{"model": "sim", "messages": [{"role": "user", "content": "a b c d"}], "max_tokens": 4}] * jobs
    counter.reset()
    functions = FunctionRequests(stack.moto.url)
    with functions.recording():
        submit_all(api, bodies)
    function_counts = functions.counts()
    api_side = sum(function_counts.values())
    engine = Timed(SimulatedEngine(capacity=64, step_s=0.01))
    with RunningWorker(engine, receive_wait_s=1) as worker:
        wait_until(lambda: worker.jobs_finished >= jobs, 300)
        time.sleep(0.5)  # let the last batched deletes go out
    # The worker's idle long polls after the backlog and the stop are not per-job work.
    by_operation = {f"{side}:{op}": n for (side, op), n in sorted(counter.counts.items()) if side != "api"}
    by_operation.update({f"api:{op}": n for op, n in sorted(function_counts.items())})
    worker_side = counter.total("worker")
    return {
        "jobs": jobs,
        "api_requests": api_side,
        "worker_requests": worker_side,
        "requests_per_job": (api_side + worker_side) / jobs,
        "worker_requests_per_job": worker_side / jobs,
        "api_requests_per_job": api_side / jobs,
        "by_operation": by_operation,
    }


def pickup_run(api: Client, samples: int) -> dict[str, Any]:
    """Submit to generation start, one job at a time, with the worker idle and long-polling in between."""
    from gpu_worker.engines.echo import EchoEngine

    engine = Timed(EchoEngine())
    latencies = []
    with RunningWorker(engine) as worker:
        time.sleep(1.0)  # the worker is now idle inside a long poll
        for i in range(samples):
            before = time.perf_counter()
            job_id = api.submit({"model": "echo", "messages": [{"role": "user", "content": f"ping {i}"}]}).job_id
            wait_until(lambda: job_id in engine.started, 30, poll_s=0.005)  # noqa: B023 (waited for at once)
            latencies.append(engine.started[job_id] - before)
            wait_until(lambda: worker.jobs_finished >= i + 1, 30, poll_s=0.01)  # noqa: B023 (waited for at once)
            time.sleep(0.3)
    return {
        "samples": [round(x, 4) for x in latencies],
        "p50_s": statistics.median(latencies),
        "p90_s": sorted(latencies)[int(0.9 * (len(latencies) - 1))],
    }


def efficiency_run(api: Client, prompts: list[str], max_tokens: int) -> dict[str, Any]:
    """CPU engine: tokens/s direct vs through the pipeline, same prompts, greedy, the same engine and model (one
    instance each: an engine belongs to the event loop it started on)."""
    from gpu_worker.engines import make_engine

    engine = make_engine("cpu")
    requests = [
        ChatCompletionRequest(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": p}],
            max_tokens=max_tokens,
            temperature=0,
        )
        for p in prompts
    ]

    async def direct() -> tuple[int, float]:
        await engine.start()
        await engine.generate("warm-up", requests[0].model_copy(update={"max_tokens": 4}))
        start = time.perf_counter()
        outputs = await asyncio.gather(*(engine.generate(f"direct-{i}", r) for i, r in enumerate(requests)))
        elapsed = time.perf_counter() - start
        await engine.close()
        return sum(o.completion_tokens for o in outputs), elapsed

    loop = asyncio.new_event_loop()
    direct_tokens, direct_s = loop.run_until_complete(direct())
    loop.close()

    timed = Timed(make_engine("cpu"))
    with RunningWorker(timed) as worker:
        wait_until(lambda: timed.ready, 300)  # the engine loads and warms up before the clock starts
        start = time.perf_counter()
        submit_all(api, [r.model_dump(exclude_none=True) for r in requests])
        wait_until(lambda: worker.jobs_finished >= len(requests), 900, poll_s=0.02)
        pipeline_s = time.perf_counter() - start
    pipeline_tokens = timed.tokens
    return {
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "direct_tokens": direct_tokens,
        "direct_s": round(direct_s, 3),
        "direct_tokens_per_s": direct_tokens / direct_s,
        "pipeline_tokens": pipeline_tokens,
        "pipeline_s": round(pipeline_s, 3),
        "pipeline_tokens_per_s": pipeline_tokens / pipeline_s,
        "efficiency": (pipeline_tokens / pipeline_s) / (direct_tokens / direct_s),
    }


def batch_runs(
    stack: LocalDeployment, api: Client, counter: RequestCounter, lines: int, idle_pickup_s: float
) -> dict[str, Any]:
    """The batch alone (requests per line, utilisation), then the same batch with interactive jobs beside it; the
    template's controller mapping paused throughout, the bench's controller thread playing it."""
    assert stack.resources is not None
    with stack.event_source_paused(stack.resources.batch_control_queue_url):
        return _batch_runs(stack, api, counter, lines, idle_pickup_s)


def _batch_runs(
    stack: LocalDeployment, api: Client, counter: RequestCounter, lines: int, idle_pickup_s: float
) -> dict[str, Any]:
    from bench.batch_bench import BATCH_MAX_TOKENS, BATCH_STEP_S, BatchBench, batch_run, interactive_run
    from gpu_worker.engines.simulated import SimulatedEngine

    bench = BatchBench.create(stack)
    lengths = [min(n, BATCH_MAX_TOKENS) for n in trace_lengths(lines)]
    print(
        f"a {lines}-line batch alone (simulated engine, capacity 64, {BATCH_STEP_S * 1000:.0f} ms steps)...", flush=True
    )
    alone = batch_run(bench, Timed(SimulatedEngine(capacity=64, step_s=BATCH_STEP_S)), lengths, counter=counter)
    print(
        f"  {alone['requests_per_line']:.3f} AWS requests per line end to end (api {alone['api_requests']}, "
        f"controller {alone['controller_requests']}, worker {alone['worker_requests']}); "
        f"{alone['utilisation_while_backlogged']:.3f} of the engine's ceiling while backlogged "
        f"({alone['backlogged_s']:.0f} s)"
    )
    print("interactive jobs at a steady rate without a batch (the control)...", flush=True)
    control = interactive_run(bench, Timed(SimulatedEngine(capacity=64, step_s=BATCH_STEP_S)), api, seconds=30)
    print(
        f"  {control['interactive_started']} jobs: wait p50 {control['interactive_wait_p50_s'] * 1000:.0f} ms, "
        f"p95 {control['interactive_wait_p95_s'] * 1000:.0f} ms (load average {control['load_average'][0]:.1f})"
    )
    print("the same jobs with the batch beside them...", flush=True)
    mixed = batch_run(bench, Timed(SimulatedEngine(capacity=64, step_s=BATCH_STEP_S)), lengths, api=api)
    goal = 2 * idle_pickup_s + BATCH_STEP_S
    print(
        f"  {mixed['interactive_started']} interactive jobs: wait p50 {mixed['interactive_wait_p50_s'] * 1000:.0f} ms, "
        f"p95 {mixed['interactive_wait_p95_s'] * 1000:.0f} ms (goal {goal * 1000:.0f} ms: 2 x idle pickup "
        f"{idle_pickup_s * 1000:.0f} ms + one {BATCH_STEP_S * 1000:.0f} ms step); {mixed['preemptions']} batch "
        f"lines preempted; batch at {mixed['utilisation_while_backlogged']:.3f} of the ceiling meanwhile (load "
        f"average {mixed['load_average'][0]:.1f})"
    )
    summary = {
        "batch_requests_per_line": round(alone["requests_per_line"], 4),
        "batch_engine_utilisation": round(alone["utilisation_while_backlogged"], 4),
        "interactive_wait_under_batch_p95_s": round(mixed["interactive_wait_p95_s"], 4),
        "interactive_wait_under_batch_goal_s": round(goal, 4),
        "interactive_wait_without_batch_p95_s": round(control["interactive_wait_p95_s"], 4),
    }
    return {"summary": summary, "alone": alone, "without_batch": control, "with_interactive": mixed}


def embedding_runs(stack: LocalDeployment, counter: RequestCounter, lines: int) -> dict[str, Any]:
    """A batch of /v1/embeddings lines through the pipeline against the model called directly (bench/embed_bench.py),
    the template's controller mapping paused, the bench's controller thread playing it."""
    from bench.batch_bench import BatchBench
    from bench.embed_bench import embedding_runs as runs
    from bench.embed_bench import embedding_texts

    assert stack.resources is not None
    texts = embedding_texts(sharegpt_prompts(lines, max_chars=100_000), lines)
    with stack.event_source_paused(stack.resources.batch_control_queue_url):
        return runs(BatchBench.create(stack), texts, counter)


def sharegpt_prompts(count: int, max_chars: int = 1500) -> list[str]:
    data = json.loads(SHAREGPT.read_text())
    prompts = []
    for conversation in data:
        turns = conversation.get("conversations") or conversation.get("conversation") or []
        first = next((t.get("value") for t in turns if t.get("from") in ("human", "user")), None)
        if first and len(first) <= max_chars:
            prompts.append(first)
        if len(prompts) == count:
            break
    return prompts


def plot(utilisation: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = utilisation["samples"]
    t = [s["t"] for s in samples]
    rates = [0.0] + [
        (b["tokens"] - a["tokens"]) / (b["t"] - a["t"])
        for a, b in zip(samples, samples[1:], strict=False)
        if b["t"] > a["t"]
    ]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t[: len(rates)], rates, label="engine tokens/s")
    ax.axhline(utilisation["ceiling_tokens_per_s"], linestyle="--", color="grey", label="engine ceiling")
    ax.set_xlabel("seconds")
    ax.set_ylabel("tokens/s")
    depth = ax.twinx()
    depth.plot(t, [s["visible"] for s in samples], color="tab:orange", label="queue visible")
    depth.plot(t, [s["in_flight"] for s in samples], color="tab:green", label="in flight")
    depth.set_ylabel("messages")
    fig.legend(loc="upper right")
    ax.set_title("Simulated engine (capacity 64): throughput and queue depth")
    fig.tight_layout()
    fig.savefig(path)


def report_structured(args: argparse.Namespace) -> dict[str, Any]:
    print(
        f"structured output: CPU engine, {args.prompts} ShareGPT prompts, max_tokens {args.max_tokens}, json_schema "
        "against unconstrained...",
        flush=True,
    )
    structured = structured_run(sharegpt_prompts(args.prompts), args.max_tokens, args.rounds)
    print(
        f"  unconstrained {structured['plain_tokens_per_s']:.1f} tok/s, json_schema "
        f"{structured['structured_tokens_per_s']:.1f} tok/s; ratio {structured['ratio']:.3f} (median of the rounds' "
        f"{structured['round_ratios']}; pooled {structured['ratio_pooled']:.3f}; first request with the schema "
        f"{structured['first_request_with_the_schema_s']:.2f} s; load {structured['loadavg_1m_before_after']})",
        flush=True,
    )
    return structured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=640)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="structured-output rounds (each: both kinds, in turn)")
    parser.add_argument("--skip-cpu", action="store_true", help="skip the CPU-engine pipeline efficiency run")
    parser.add_argument("--batch-lines", type=int, default=5000, help="lines of the batch runs (0: skip them)")
    parser.add_argument("--only-batch", action="store_true", help="only the idle pickup and the batch runs")
    parser.add_argument(
        "--embedding-lines", type=int, default=5000, help="lines of the embedding batch run (0: skip it)"
    )
    parser.add_argument(
        "--only-embeddings", action="store_true", help="only the embedding batch against the model called directly"
    )
    parser.add_argument(
        "--only-structured",
        action="store_true",
        help="only structured output against unconstrained generation on the CPU engine",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.only_structured:
        structured = report_structured(args)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS / f"bench-structured-{stamp}.json").write_text(json.dumps({"structured": structured}, indent=2))
        print(json.dumps({"structured_output_speed_ratio": round(structured["ratio"], 4)}))
        return
    counter = RequestCounter()
    # moto server's recorder (FunctionRequests) writes here rather than into the working directory.
    os.environ["MOTO_RECORDER_FILEPATH"] = str(RESULTS / "moto-recording.jsonl")
    # The API serves any model name: the in-process workers here run the simulated and echo engines, which answer
    # whatever model a request names, and the CPU engine, whose model the efficiency run names.
    stack = LocalDeployment.with_tenants(
        {API_KEY: "bench"}, api_port=free_port(), moto_port=free_port(), workers=0, served_models=("*",)
    )
    with stack:
        stack.export_env()
        api = Client(stack.api_url, API_KEY)
        moto_rate = emulator_rate(stack)
        print(f"moto server answers {moto_rate:.0f} requests/s here (8 callers)", flush=True)
        full = single = requests = pickup = batch = efficiency = structured = streaming = None
        if args.only_embeddings:
            embeddings = embedding_runs(stack, counter, args.embedding_lines)
        elif not args.only_batch:
            print("engine utilisation: backlog into the simulated engine (capacity 64)...", flush=True)
            lengths = trace_lengths(args.jobs)
            full = utilisation_run(
                stack, api, capacity=64, worker_capacity=64, lengths=lengths, step_s=STEP_S, sample=True
            )
            print(
                f"  while the backlog lasted: {full['while_backlogged']:.3f} of the ceiling; whole run with the drain "
                f"tail: {full['utilisation']:.3f} ({full['tokens_per_s']:.0f} of {full['ceiling_tokens_per_s']:.0f} "
                f"tokens/s; batch {full['batch_fullness']:.3f} full over the steps run)"
            )
            print("one-at-a-time worker, same engine...", flush=True)
            single = utilisation_run(
                stack, api, capacity=64, worker_capacity=1, lengths=lengths[:6], step_s=STEP_S, sample=False
            )
            print(
                f"  {single['tokens_per_s']:.1f} tokens/s of {single['ceiling_tokens_per_s']:.0f}: "
                f"{single['utilisation']:.4f}"
            )
            print("AWS requests per job at backlog...", flush=True)
            requests = requests_run(stack, api, counter, jobs=200)
            print(
                f"  {requests['requests_per_job']:.2f} per job (api {requests['api_requests_per_job']:.2f}, "
                f"worker {requests['worker_requests_per_job']:.2f})"
            )
        if not args.only_embeddings:
            print("idle pickup latency...", flush=True)
            pickup = pickup_run(api, samples=15)
            print(f"  p50 {pickup['p50_s'] * 1000:.0f} ms, p90 {pickup['p90_s'] * 1000:.0f} ms")
            batch = batch_runs(stack, api, counter, args.batch_lines, pickup["p50_s"]) if args.batch_lines else None
            embeddings = (
                embedding_runs(stack, counter, args.embedding_lines)
                if args.embedding_lines and not args.only_batch
                else None
            )
        if not args.skip_cpu and not args.only_batch and not args.only_embeddings:
            print(
                f"pipeline efficiency: CPU engine, {args.prompts} ShareGPT prompts, max_tokens {args.max_tokens}...",
                flush=True,
            )
            efficiency = efficiency_run(api, sharegpt_prompts(args.prompts), args.max_tokens)
            print(
                f"  direct {efficiency['direct_tokens_per_s']:.1f} tok/s, pipeline "
                f"{efficiency['pipeline_tokens_per_s']:.1f} tok/s: {efficiency['efficiency']:.3f}"
            )
        if not args.skip_cpu and not args.only_batch and not args.only_embeddings:
            print(
                "time to first token: CPU engine, through the API streamed against the engine directly...", flush=True
            )
            streaming = stream_run(stack, API_KEY, counter)
            print(
                f"  direct p50 {streaming['direct_ttft_p50_s']:.3f} s, through the API p50 "
                f"{streaming['api_ttft_p50_s']:.3f} s (+{streaming['api_added_ttft_p50_s']:.3f} s, goal <= 0.5); "
                f"{streaming['requests_per_1000_streamed_tokens']:.0f} AWS requests per 1,000 streamed tokens"
            )
        if not args.skip_cpu and not args.only_batch and not args.only_embeddings:
            structured = report_structured(args)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    if full is not None:
        plot(full, RESULTS / f"throughput-{stamp}.png")
    summary = {
        "engine_utilisation": round(full["while_backlogged"], 4) if full else None,
        "one_at_a_time_utilisation": round(single["utilisation"], 4) if single else None,
        "pipeline_efficiency": round(efficiency["efficiency"], 4) if efficiency else None,
        "structured_output_speed_ratio": round(structured["ratio"], 4) if structured else None,
        "requests_per_job": round(requests["requests_per_job"], 3) if requests else None,
        "idle_pickup_p50_s": round(pickup["p50_s"], 4) if pickup else None,
        "stream_ttft_added_p50_s": round(streaming["api_added_ttft_p50_s"], 4) if streaming else None,
        "requests_per_1000_streamed_tokens": (
            round(streaming["requests_per_1000_streamed_tokens"], 1) if streaming else None
        ),
        **(batch["summary"] if batch else {}),
        **(embeddings["summary"] if embeddings else {}),
    }
    details = {
        "summary": summary,
        "emulator_requests_per_s": moto_rate,
        "utilisation": full,
        "one_at_a_time": single,
        "requests": requests,
        "pickup": pickup,
        "efficiency": efficiency,
        "structured": structured,
        "streaming": streaming,
        "batch": batch,
        "embeddings": embeddings,
    }
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(details, indent=2))
    print(f"figures: {RESULTS / f'bench-{stamp}.json'}; plot: {RESULTS / f'throughput-{stamp}.png'}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
