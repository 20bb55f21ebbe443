"""A run's figures (GPU hours, queue waits, expired jobs, scale events, cost per million jobs) and the comparison plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.scaling import figures
from bench.scaling.simulation import Run

# The anchors tuned as their docs recommend, against which issue #29's targets are read (``checks``).
TUNED = ("sagemaker_tuned", "keda_tuned", "queue_processing_tuned")
# How far above the best tuned anchor's p95 wait after the first 15 minutes the deployed policy's may be (issue #29).
P95_SLACK_S = 10.0
# At most this fraction of every tuned anchor's GPU hours (issue #29).
GPU_TARGET = 0.8


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def waits(run: Run) -> list[float]:
    """Submit to start for every job that did not expire; a job never started counts with its wait so far."""
    return [
        (job.started_s if job.started_s is not None else run.end_s) - job.submitted_s
        for job in run.jobs
        if not job.expired
    ]


def latencies(run: Run) -> list[float]:
    """Submit to result (queue wait plus generation); a job not finished counts with its time so far."""
    return [
        (job.finished_s if job.finished_s is not None else run.end_s) - job.submitted_s
        for job in run.jobs
        if not job.expired
    ]


def request_cost_usd(run: Run, alarm_metrics: int) -> float:
    """AWS requests outside the GPU at list prices: per job, the worker's receives as simulated, KEDA's polls, and
    the scaling alarms' monthly price for the hours simulated."""
    counts = figures.RequestCounts()
    per_job = counts.cost_usd() - (0.1 * figures.SQS_PER_MILLION) / 1e6  # receives are counted, not assumed
    jobs = len(run.jobs)
    total = jobs * per_job + run.receives * figures.SQS_PER_MILLION / 1e6
    total += run.keda_polls * figures.SQS_PER_MILLION / 1e6
    total += alarm_metrics * figures.CLOUDWATCH_ALARM_METRIC_MONTH * (run.end_s / 3600) / figures.HOURS_PER_MONTH
    return total


AFTER_S = 900.0  # "after the first 15 minutes": the cold start from an idle stack is reported on its own


def first_job_start_s(run: Run) -> float | None:
    """Submit of the first job (to an idle stack) to its first token."""
    if not run.jobs:
        return None
    first = min(run.jobs, key=lambda j: j.submitted_s)
    return None if first.first_token_s is None else first.first_token_s - first.submitted_s


def floor_usd(run: Run, *, eks: bool = False, volume_gib: float = 100.0) -> float:
    """The idle floor over the hours run: network, endpoints and logs (and EKS's control plane for KEDA), plus the
    warm pool's stopped volumes."""
    hours = run.end_s / 3600
    pool = run.warm_pool * volume_gib * figures.EBS_GP3_GIB_MONTH_USD / figures.HOURS_PER_MONTH
    return (figures.idle_floor_hourly_usd(eks=eks) + pool) * hours


def summarise(run: Run, *, instance_type: str, alarm_metrics: int, eks: bool = False) -> dict[str, Any]:
    price = figures.GPU_HOURLY_USD[instance_type]
    values = waits(run)
    jobs = max(1, len(run.jobs))
    gpu_cost = run.gpu_hours * price
    requests = request_cost_usd(run, alarm_metrics)
    floor = floor_usd(run, eks=eks)
    started = [j for j in run.jobs if j.started_s is not None]
    start = min((j.submitted_s for j in run.jobs), default=0.0)
    late = [
        w
        for j, w in zip((j for j in run.jobs if not j.expired), values, strict=False)
        if j.submitted_s - start >= AFTER_S
    ]
    first = first_job_start_s(run)
    summary: dict[str, Any] = {
        "gpu_hours": round(run.gpu_hours, 3),
        "first_job_start_s": None if first is None else round(first, 1),
        "p95_wait_after_15min_s": round(percentile(late, 0.95), 2),
        "usd_per_million_jobs": round((gpu_cost + requests + floor) / jobs * 1e6, 2),
        "p50_wait_s": round(percentile(values, 0.50), 2),
        "p95_wait_s": round(percentile(values, 0.95), 2),
        "p99_wait_s": round(percentile(values, 0.99), 2),
        "p95_latency_s": round(percentile(latencies(run), 0.95), 2),
        "expired": sum(1 for j in run.jobs if j.expired),
        "unstarted": sum(1 for j in run.jobs if j.started_s is None and not j.expired),
        "scale_events": run.activities,
        "max_tasks": run.max_tasks,
        "cost_per_million_jobs_usd": round((gpu_cost + requests) / jobs * 1e6, 2),
        "request_cost_per_million_jobs_usd": round(requests / jobs * 1e6, 2),
        "floor_per_million_jobs_usd": round(floor / jobs * 1e6, 2),
        "zeroed_while_waiting": run.zeroed_while_waiting,
        "most_desired_before_first_task": run.most_desired_before_first_task,
    }
    if run.wakes_s:
        summary["task_requested_after_s"] = round(max(run.wakes_s), 2)
    if run.warm_pool:
        # Each start from the pool launches a replacement, billed while it initializes (no ReuseOnScaleIn on ECS).
        summary["pool_starts"] = run.pool_starts
        summary["pool_initializations"] = run.pool_initializations
    summary["instance_releases"] = run.releases
    del started
    return summary


def plot(runs: list[Run], path: Path, title: str) -> None:
    """Tasks (desired, running), instances and queue depth over time, one panel per policy on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, sharex=True, sharey=True, figsize=(11, 2.2 * len(runs)), squeeze=False)
    depth_max = max((v + f for run in runs for _, _, _, v, f, _ in run.timeline), default=1)
    task_max = max((max(d, i) for run in runs for _, d, _, _, _, i in run.timeline), default=1)
    for ax, run in zip(axes[:, 0], runs, strict=False):
        minutes = [t / 60 for t, *_ in run.timeline]
        ax.step(minutes, [d for _, d, *_ in run.timeline], where="post", label="desired tasks", color="tab:blue")
        ax.step(minutes, [r for _, _, r, *_ in run.timeline], where="post", label="running tasks", color="tab:green")
        ax.step(
            minutes, [i for *_, i in run.timeline], where="post", label="GPU instances", color="tab:red", linestyle=":"
        )
        ax.set_ylim(0, task_max + 0.5)
        ax.set_ylabel(run.scenario, rotation=0, ha="right", va="center")
        depth = ax.twinx()
        depth.fill_between(
            minutes,
            [v + f for *_, v, f, _ in run.timeline],
            step="post",
            alpha=0.2,
            color="grey",
            label="visible + in flight",
        )
        depth.set_ylim(0, depth_max * 1.05)
    axes[0, 0].legend(loc="upper left", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel("minutes since the first job")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def checks(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets on one trace: at most 0.8 x every tuned anchor's GPU hours, a p95 wait after the first 15
    minutes at most the best tuned anchor's plus 10 s, a first job within 180 s of a submit to an idle stack."""
    mine = results["deployed"]
    best_p95 = min(results[n]["p95_wait_after_15min_s"] for n in TUNED)
    over = {n: round(mine["gpu_hours"] / results[n]["gpu_hours"], 3) for n in TUNED}
    return {
        "gpu_hours_over_tuned": over,
        "gpu_hours_at_most_0_8_of_every_tuned": all(v <= GPU_TARGET for v in over.values()),
        "best_tuned_p95_after_15min_s": best_p95,
        "p95_after_15min_within_10_s_of_best_tuned": mine["p95_wait_after_15min_s"] <= best_p95 + P95_SLACK_S,
        "first_job_within_180_s": mine["first_job_start_s"] is not None and mine["first_job_start_s"] <= 180,
    }


def table(results: dict[str, dict[str, Any]]) -> None:
    columns = [
        "gpu_hours",
        "first_job_start_s",
        "p95_wait_after_15min_s",
        "p95_wait_s",
        "p99_wait_s",
        "expired",
        "scale_events",
        "max_tasks",
        "usd_per_million_jobs",
        "floor_per_million_jobs_usd",
    ]
    heads = (
        "GPU h",
        "1st job s",
        "p95>15m s",
        "p95 wait",
        "p99 wait",
        "expired",
        "events",
        "most",
        "$/M jobs",
        "floor $/M",
    )
    print(f"\n{'policy':<26}" + "".join(f"{c:>11}" for c in heads))
    for name, summary in results.items():
        print(f"{name:<26}" + "".join(f"{str(summary.get(c, '')):>11}" for c in columns))
