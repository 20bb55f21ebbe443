"""``python -m bench.scaling``: the deployed scaling policy and three anchors on one request trace, side by side.

Reads the deployed policy from the synthesized template (synthesizes the app unless ``--template`` names one), runs
each policy over the trace with the same engine, cold start and fleet ceiling, prints a table, writes
bench/results/scaling-<time>.json and scaling-<time>.png, then a batch-size sweep (the stack synthesized again at
each ``max_num_seqs``), and ends with one JSON line keyed by policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from async_inference import settings
from bench.scaling import figures
from bench.scaling.engine import EngineModel
from bench.scaling.keda import read_scaled_object
from bench.scaling.policies import scenarios
from bench.scaling.report import plot, summarise
from bench.scaling.simulation import simulate
from bench.scaling.template import read
from bench.scaling.trace import AZURE_CONVERSATION, load
from cdk.capacity import INSTANCE_GPUS, MODELS, kv_cache_tokens, max_num_seqs, percentile_tokens

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


def synthesize(**options: Any) -> dict[str, Any]:
    """The stack's template, built as app.py builds it from cdk.json's context (plus ``options``)."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from app import build

    context = {**json.loads((ROOT / "cdk.json").read_text())["context"], **options}
    with tempfile.TemporaryDirectory() as outdir:
        app = App(context=context, outdir=outdir)
        return Template.from_stack(build(app)).to_json()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=AZURE_CONVERSATION, help="CSV with TIMESTAMP, ContextTokens, "
                        "GeneratedTokens (default: the Azure LLM inference conversation trace)")
    parser.add_argument("--template", type=Path, help="synthesized template JSON (default: synthesize the app)")
    parser.add_argument("--max-tasks", type=int, help="fleet ceiling for every policy (default: the template's)")
    parser.add_argument("--max-num-seqs", type=int, help="sequences a task batches (default: the template's; "
                        "another value synthesizes the stack with it)")
    parser.add_argument("--cold-start-s", type=float, help="a measured cold start, instance launch to serving, "
                        "replacing the modelled boot + pull + download + engine start")
    parser.add_argument("--tail-s", type=float, default=3600.0, help="simulated time after the last submission")
    parser.add_argument("--ttl-s", type=float, default=float(settings.DEFAULT_TTL_S), help="queue deadline")
    parser.add_argument("--resume-delay-s", type=float, default=figures.SQS_RESUME_DELAY_S,
                        help="extra delay before an inactive queue's metrics resume")
    parser.add_argument("--sweep", default="16,64,sized", help="max_num_seqs values for the batch-size sweep "
                        "('sized': the capacity rule's value), each a synthesis of the stack; empty for none")
    parser.add_argument("--anchor-instance-warmup-s", type=float, default=figures.INSTANCE_WARMUP_S,
                        help="the anchors' capacity provider instance warm-up (default: ECS's 300 s; the deployed "
                        "policy's is the template's)")
    parser.add_argument("--limit", type=int, help="only the first N requests (quick looks)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    requests = load(args.trace)
    if args.limit:
        requests = requests[: args.limit]
    template = json.loads(args.template.read_text()) if args.template else synthesize()
    deployed = read(template)
    if args.max_num_seqs and args.max_num_seqs != deployed.worker.max_num_seqs:
        if args.template:
            raise SystemExit(f"--max-num-seqs {args.max_num_seqs} differs from the template's "
                             f"{deployed.worker.max_num_seqs}: without --template the stack is synthesized with it")
        template = synthesize(max_num_seqs=args.max_num_seqs)
        deployed = read(template)
    model = MODELS[deployed.worker.model]
    gpu, gpus = INSTANCE_GPUS[deployed.worker.instance_type]
    seqs = deployed.worker.max_num_seqs
    max_tasks = args.max_tasks or deployed.policy.maximum
    cluster = dataclasses.replace(deployed.cluster, max_instances=max(max_tasks, deployed.cluster.max_instances)
                                  if args.max_tasks else deployed.cluster.max_instances)
    cold = figures.ColdStart(model_download_s=model.weight_bytes() / figures.MODEL_DOWNLOAD_BYTES_PER_S,
                             total_s=args.cold_start_s)
    kv_tokens = kv_cache_tokens(model, gpu)
    sized = max_num_seqs(model, gpu, sequence_tokens=percentile_tokens(
        [r.context_tokens + r.generated_tokens for r in requests]))

    def engine(batch: int) -> EngineModel:
        return EngineModel(model, gpu, max_num_seqs=batch, kv_cache_tokens=kv_tokens)

    common = dict(ttl_s=args.ttl_s, tail_s=args.tail_s, resume_delay_s=args.resume_delay_s)
    print(f"trace {args.trace.name}: {len(requests)} jobs over {requests[-1].arrival_s / 60:.1f} min; "
          f"{model.name} on {deployed.worker.instance_type} ({gpu.name}); max_num_seqs {seqs} (rule: {sized}); "
          f"fleet ceiling {max_tasks} tasks; cold start on a new instance {cold.instance_boot_s + cold.fresh_task_s():.0f} s")
    keda_spec = read_scaled_object()
    cpu_vcpus = 4.0
    choices = dict(max_tasks=max_tasks, keda_spec=keda_spec, cpu_vcpus=cpu_vcpus,
                   anchor_instance_warmup_s=args.anchor_instance_warmup_s)
    runs = {}
    for scenario in scenarios(template, **choices):
        t0 = time.monotonic()
        run = simulate(scenario, requests, engine(seqs), cluster, cold, **common)
        alarm_metrics = sum(len(a.query.stats) for a in scenario.policy.alarms) if scenario.policy else 0
        runs[scenario.name] = (run, summarise(run, instance_type=deployed.worker.instance_type,
                                              alarm_metrics=alarm_metrics))
        print(f"  simulated {scenario.name} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    results = {name: summary for name, (_, summary) in runs.items()}
    _table(results)

    sweep = []
    for value in [v.strip() for v in args.sweep.split(",") if v.strip()]:
        batch = sized if value == "sized" else int(value)
        if batch == seqs:
            variant = template
        elif args.template:
            print(f"  sweep: max_num_seqs {batch} skipped (--template gives one stack, at {seqs})", file=sys.stderr)
            continue
        else:
            variant = synthesize(max_num_seqs=batch)
        for scenario in scenarios(variant, **choices):
            if scenario.name not in ("sagemaker", "deployed"):
                continue
            run = simulate(scenario, requests, engine(batch), cluster, cold, **common)
            summary = summarise(run, instance_type=deployed.worker.instance_type, alarm_metrics=0)
            sweep.append({"policy": scenario.name, "max_num_seqs": batch, **summary})
    if sweep:
        print("\nbatch-size sweep (same trace, same ceiling):")
        for row in sweep:
            print(f"  {row['policy']:<10} max_num_seqs {row['max_num_seqs']:>4}: {row['gpu_hours']:.2f} GPU h, "
                  f"p95 wait {row['p95_wait_s']:.1f} s, ${row['cost_per_million_jobs_usd']:.0f}/M jobs")

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / f"scaling-{stamp}.png"
    plot([run for run, _ in runs.values()], png,
         f"{args.trace.name}, max_num_seqs {seqs}, ceiling {max_tasks} tasks, {deployed.worker.instance_type}")
    ratio = results["deployed"]["gpu_hours"] / results["sagemaker"]["gpu_hours"]
    document = {
        "trace": str(args.trace), "jobs": len(requests), "max_num_seqs": seqs, "sized_max_num_seqs": sized,
        "max_tasks": max_tasks, "cold_start": dataclasses.asdict(cold), "prices_as_of": figures.PRICE_DATE,
        "policies": results, "sweep": sweep, "plot": str(png), "deployed_over_sagemaker_gpu_hours": ratio,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    (args.out / f"scaling-{stamp}.json").write_text(json.dumps(document, indent=2))
    print(f"\ndeployed / sagemaker GPU hours: {ratio:.3f}; p95 wait {results['deployed']['p95_wait_s']} s vs "
          f"{results['sagemaker']['p95_wait_s']} s; plot {png}")
    for name, summary in results.items():
        if name != "deployed":
            summary.pop("wake_from_zero_s", None)
            summary.pop("first_job_start_s", None)
    print(json.dumps(results))
    return 0


def _table(results: dict[str, dict[str, Any]]) -> None:
    columns = ["gpu_hours", "p50_wait_s", "p95_wait_s", "p99_wait_s", "p95_latency_s", "expired", "unstarted",
               "scale_events", "max_tasks", "cost_per_million_jobs_usd", "wake_from_zero_s"]
    heads = ("GPU h", "p50 wait", "p95 wait", "p99 wait", "p95 result", "expired", "unstarted", "events", "most",
             "$/M jobs", "wake s")
    print(f"\n{'policy':<17}" + "".join(f"{c:>11}" for c in heads))
    for name, summary in results.items():
        print(f"{name:<17}" + "".join(f"{summary.get(c, ''):>11}" for c in columns))


if __name__ == "__main__":
    raise SystemExit(main())
