"""Generated request traces: arrival patterns the given Azure trace does not hold, with its token lengths.

Each generator is seeded and documented by its parameters (``TRACES`` holds the ones ``make simulate`` runs). Arrival
times come from the pattern; each job's (ContextTokens, GeneratedTokens) pair is drawn, with replacement, from the
Azure LLM inference conversation trace, so every trace asks the engine for the same kind of work.

* ``bursty``: on-off. Bursts of ``burst_jobs`` jobs (uniform between the bounds) arrive at ``peak_per_s`` (uniform
  between the bounds) as a Poisson process; the gaps between bursts are exponential with mean ``gap_mean_s``, clipped
  to ``gap_bounds_s``. The coefficient of variation of inter-arrival times is about sqrt(jobs per burst x 2): above 10.
* ``idle_gaps``: sessions of Poisson arrivals at ``rate_per_s`` lasting ``session_s`` (uniform between the bounds),
  separated by idle gaps drawn uniformly from ``gap_bounds_s`` (1 to 15 minutes).
* ``diurnal``: a day compressed into ``day_s``: a Poisson process whose rate follows
  ``night + (peak - night) x (1 - cos(2 pi t / day)) / 2`` (night at both ends, the peak at midday), drawn by thinning.
* ``batch_and_trickle``: ``batch_jobs`` jobs submitted within ``batch_spread_s`` at ``batch_at_s`` (one batch
  upload), beside interactive jobs arriving as a Poisson process at ``trickle_per_s`` for ``span_s``.
"""

from __future__ import annotations

import csv
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scaling.trace import AZURE_CONVERSATION, Request


@dataclass(frozen=True)
class GeneratedTrace:
    """A generator and its parameters: ``build(lengths)`` gives the requests."""

    name: str
    pattern: Callable[..., list[float]]
    parameters: dict[str, Any] = field(default_factory=dict)
    seed: int = 29

    def build(self, lengths: list[tuple[int, int]]) -> list[Request]:
        rng = random.Random(self.seed)
        arrivals = sorted(self.pattern(rng, **self.parameters))
        start = arrivals[0]
        return [Request(t - start, *rng.choice(lengths)) for t in arrivals]


def bursty(
    rng: random.Random,
    *,
    bursts: int,
    burst_jobs: tuple[int, int],
    peak_per_s: tuple[float, float],
    gap_mean_s: float,
    gap_bounds_s: tuple[float, float],
) -> list[float]:
    arrivals, now = [], 0.0
    for _ in range(bursts):
        rate = rng.uniform(*peak_per_s)
        for _ in range(rng.randint(*burst_jobs)):
            now += rng.expovariate(rate)
            arrivals.append(now)
        now += min(max(rng.expovariate(1 / gap_mean_s), gap_bounds_s[0]), gap_bounds_s[1])
    return arrivals


def idle_gaps(
    rng: random.Random,
    *,
    sessions: int,
    rate_per_s: float,
    session_s: tuple[float, float],
    gap_bounds_s: tuple[float, float],
) -> list[float]:
    arrivals, now = [], 0.0
    for _ in range(sessions):
        end = now + rng.uniform(*session_s)
        while True:
            now += rng.expovariate(rate_per_s)
            if now >= end:
                break
            arrivals.append(now)
        now = end + rng.uniform(*gap_bounds_s)
    return arrivals


def diurnal(rng: random.Random, *, day_s: float, night_per_s: float, peak_per_s: float) -> list[float]:
    arrivals, now = [], 0.0
    while True:
        now += rng.expovariate(peak_per_s)
        if now >= day_s:
            return arrivals
        rate = night_per_s + (peak_per_s - night_per_s) * (1 - math.cos(2 * math.pi * now / day_s)) / 2
        if rng.random() < rate / peak_per_s:
            arrivals.append(now)


def batch_and_trickle(
    rng: random.Random,
    *,
    batch_jobs: int,
    batch_at_s: float,
    batch_spread_s: float,
    trickle_per_s: float,
    span_s: float,
) -> list[float]:
    arrivals = [batch_at_s + rng.uniform(0, batch_spread_s) for _ in range(batch_jobs)]
    now = 0.0
    while True:
        now += rng.expovariate(trickle_per_s)
        if now >= span_s:
            return arrivals
        arrivals.append(now)


TRACES = (
    GeneratedTrace(
        "bursty",
        bursty,
        dict(bursts=30, burst_jobs=(60, 140), peak_per_s=(60.0, 120.0), gap_mean_s=180.0, gap_bounds_s=(60.0, 600.0)),
    ),
    GeneratedTrace(
        "idle_gaps",
        idle_gaps,
        dict(sessions=24, rate_per_s=1.0, session_s=(60.0, 180.0), gap_bounds_s=(60.0, 900.0)),
    ),
    GeneratedTrace("diurnal", diurnal, dict(day_s=7200.0, night_per_s=0.01, peak_per_s=0.8)),
    GeneratedTrace(
        "batch_and_trickle",
        batch_and_trickle,
        dict(batch_jobs=2000, batch_at_s=600.0, batch_spread_s=10.0, trickle_per_s=0.1, span_s=5400.0),
    ),
)


def token_lengths(path: Path = AZURE_CONVERSATION) -> list[tuple[int, int]]:
    """The trace's (ContextTokens, GeneratedTokens) pairs, in file order."""
    with path.open(newline="") as handle:
        return [(max(1, int(r["ContextTokens"])), max(1, int(r["GeneratedTokens"]))) for r in csv.DictReader(handle)]


def shape(requests: list[Request]) -> dict[str, float]:
    """What a trace is: jobs, span, the coefficient of variation of its inter-arrival times, its peak (most jobs in
    one second) and its longest idle gap."""
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(requests, requests[1:], strict=False)]
    per_second: dict[int, int] = {}
    for r in requests:
        per_second[int(r.arrival_s)] = per_second.get(int(r.arrival_s), 0) + 1
    mean = statistics.fmean(gaps) if gaps else 0.0
    return {
        "jobs": len(requests),
        "span_min": round(requests[-1].arrival_s / 60, 1),
        "interarrival_cv": round(statistics.pstdev(gaps) / mean, 2) if mean else 0.0,
        "peak_per_s": max(per_second.values()),
        "longest_gap_min": round(max(gaps, default=0.0) / 60, 1),
    }
