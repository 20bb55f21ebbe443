"""The least GPU time a keep-alive could spend on a trace: the best keep-alive in hindsight (issue 29).

A keep-alive decides one thing, when to let the last task go. Knowing every arrival in advance, the best it can do
between two consecutive submissions ``g`` seconds apart is the offline ski-rental choice: keep the task through the
gap if ``g`` is below what a wake costs, otherwise let it go the moment the gap begins and pay one wake. So one task,
kept or woken that way, costs

    floor = wake + sum over consecutive submissions of min(gap, wake)

(the first wake included; nothing kept after the last job). What a wake costs depends on whether jobs wait for it:

* **no job waits a wake** (``wake_gpu_s``): the instance is started a start's length before the submission (a
  pre-warm), so the GPU it burns before serving lies in the gap, plus what the warm pool spends to replace the
  instance it gave. A policy whose p95 wait stays near 0 after pauses pays this for nearly every wake.
* **the jobs wait each wake** (``replacement_gpu_s``): the instance starts at the submission and its start overlaps
  the session it serves (billed either way), so a wake costs only the pool's replacement, and each session after a
  release waits the start.

The floor counts no service time beyond the arrivals and no second task: it is below what any keep-alive on the same
capacity layer spends at that reading, so a GPU target under it cannot be met by choosing when to let go, only by
making a wake cheaper (``wake_gpu_s_within``) or by running fewer tasks than one. The ski-rental rule (keep for one
wake's price, then let go), which the learned keep-alive (``async_inference.keep_alive``) falls back on, costs at most
twice this floor at the same price: a gap it lets go costs two wakes where knowing it cost one.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from bench.scaling.figures import ColdStart


def wake_gpu_s(cold: ColdStart, *, warm_pool: bool, pre_initialized: bool = True) -> float:
    """GPU-seconds one wake from zero costs the stack: with a pool, the pooled instance's start to serving plus the
    replacement the pool launches for it (billed while it initializes); without, a fresh instance's launch to
    serving."""
    if not warm_pool:
        return cold.instance_boot_s + cold.fresh_task_s()
    start = cold.warm_pool_start_s + cold.warm_task_s(
        weights_cached=pre_initialized, page_cache_cold=True, compile_cached=False
    )
    return start + cold.pool_init_s(pre_initialized=pre_initialized)


def replacement_gpu_s(cold: ColdStart, *, warm_pool: bool, pre_initialized: bool = True) -> float:
    """GPU-seconds a wake costs beyond the session it serves when its jobs wait for it: the warm pool's replacement of
    the instance it gave (0 without a pool)."""
    return cold.pool_init_s(pre_initialized=pre_initialized) if warm_pool else 0.0


def keep_alive_floor_s(arrivals: Sequence[float], wake_s: float) -> float:
    """GPU-seconds of one task under the best keep-alive in hindsight over ``arrivals`` (submission times, seconds),
    each wake costing ``wake_s``; 0 for no arrival."""
    ordered = sorted(arrivals)
    if not ordered:
        return 0.0
    return wake_s + sum(min(later - earlier, wake_s) for earlier, later in zip(ordered, ordered[1:], strict=False))


def best_fixed_keep_alive(arrivals: Sequence[float], wake_s: float) -> tuple[float, float]:
    """The one keep-alive (seconds after each submission) that would have cost least over ``arrivals``, and its
    GPU-seconds: the first wake, each gap no longer than it kept through, each longer one kept for it and then woken
    from, and it kept after the last submission. What a keep-alive that learns one number from the pauses (as the
    paper's histogram does) approaches once it has seen them all; (0, 0) for no arrival."""
    ordered = sorted(arrivals)
    if not ordered:
        return 0.0, 0.0
    gaps = sorted(later - earlier for earlier, later in zip(ordered, ordered[1:], strict=False))
    below = list(itertools.accumulate(gaps, initial=0.0))  # below[i]: the i shortest gaps' sum

    def cost(keep_alive: float) -> float:
        kept = bisect.bisect_right(gaps, keep_alive)
        return wake_s + below[kept] + (len(gaps) - kept) * (keep_alive + wake_s) + keep_alive

    best = min((0.0, *gaps), key=cost)
    return best, cost(best)


def wake_gpu_s_within(arrivals: Sequence[float], budget_s: float, *, tolerance_s: float = 0.5) -> float:
    """The dearest wake (GPU-seconds) at which the floor over ``arrivals`` stays within ``budget_s`` (at least 0 s),
    to within ``tolerance_s``."""
    ordered = sorted(arrivals)
    low, high = 0.0, max(budget_s, 0.0)
    while high - low > tolerance_s:  # the floor grows with the wake's price (it is at least the price): bisect
        middle = (low + high) / 2
        low, high = (middle, high) if keep_alive_floor_s(ordered, middle) <= budget_s else (low, middle)
    return round(low, 1)


def floor_figures(
    arrivals: Sequence[float],
    wake_s: float,
    tuned_gpu_hours: dict[str, float],
    *,
    target: float,
    waited_wake_s: float,
) -> dict[str, object]:
    """The floor's GPU hours with no job waiting a wake (``wake_s``), its ratio to each tuned anchor's, whether
    ``target`` x the cheapest tuned anchor is within its reach, and the dearest wake that would put it within reach;
    the floor with the jobs waiting each wake (``waited_wake_s``) and its ratios; and the best fixed keep-alive in
    hindsight (no job waiting a wake), with its GPU hours and ratios."""
    floor_h = keep_alive_floor_s(arrivals, wake_s) / 3600.0
    waited_h = keep_alive_floor_s(arrivals, waited_wake_s) / 3600.0
    fixed_s, fixed_gpu_s = best_fixed_keep_alive(arrivals, wake_s)
    budget_h = target * min(tuned_gpu_hours.values())
    within = wake_gpu_s_within(arrivals, budget_h * 3600.0)
    return {
        "wake_gpu_s": round(wake_s, 1),
        "gpu_hours": round(floor_h, 3),
        "over_tuned": {name: round(floor_h / hours, 3) for name, hours in tuned_gpu_hours.items()},
        "gpu_target_within_reach": floor_h <= budget_h,
        "wake_gpu_s_for_target": within,
        "waited_wake_gpu_s": round(waited_wake_s, 1),
        "gpu_hours_jobs_waiting_each_wake": round(waited_h, 3),
        "jobs_waiting_each_wake_over_tuned": {
            name: round(waited_h / hours, 3) for name, hours in tuned_gpu_hours.items()
        },
        "best_fixed_keep_alive_s": round(fixed_s, 1),
        "best_fixed_keep_alive_gpu_hours": round(fixed_gpu_s / 3600.0, 3),
        "best_fixed_keep_alive_over_tuned": {
            name: round(fixed_gpu_s / 3600.0 / hours, 3) for name, hours in tuned_gpu_hours.items()
        },
    }
