"""The best keep-alive in hindsight (bench/scaling/floor.py): the GPU floor a keep-alive cannot go under."""

from __future__ import annotations

import pytest

from async_inference.keep_alive import KeepAlivePolicy
from bench.scaling import figures
from bench.scaling.floor import (
    best_fixed_keep_alive,
    floor_figures,
    keep_alive_floor_s,
    replacement_gpu_s,
    wake_gpu_s,
    wake_gpu_s_within,
)
from cdk.capacity import QWEN2_5_1_5B


def test_a_gap_shorter_than_a_wake_is_kept_through_and_a_longer_one_costs_one_wake() -> None:
    # GIVEN submissions 100 s and then 1,000 s apart, and a wake that costs 500 GPU-seconds
    arrivals = [1100.0, 0.0, 100.0]
    # WHEN the floor is taken
    floor = keep_alive_floor_s(arrivals, 500.0)
    # THEN it is the first wake, the short gap kept through and the long one let go and woken from
    assert floor == 500.0 + 100.0 + 500.0


def test_no_submission_costs_nothing() -> None:
    assert keep_alive_floor_s([], 500.0) == 0.0


def test_the_dearest_wake_within_a_budget_is_where_the_floor_meets_it() -> None:
    # GIVEN three submissions 1,000 s apart (the floor is 3 wakes' price for a wake under 1,000 GPU-seconds)
    arrivals = [0.0, 1000.0, 2000.0]
    # WHEN the dearest wake within 1,500 GPU-seconds is sought
    within = wake_gpu_s_within(arrivals, 1500.0)
    # THEN it is 500 GPU-seconds, and the floor there is within the budget
    assert within == pytest.approx(500.0, abs=0.5)
    assert keep_alive_floor_s(arrivals, within) <= 1500.0


def test_the_target_is_out_of_reach_when_the_floor_exceeds_it_for_the_cheapest_tuned_anchor() -> None:
    # GIVEN submissions whose floor at a 500 GPU-second wake is 1,000 GPU-seconds, and tuned anchors of which the
    # cheaper one's 0.8 is below it
    arrivals = [0.0, 1000.0]
    tuned = {"cheap": 1000.0 / 3600 / 0.8 * 0.9, "dear": 1.0}
    # WHEN the floor's figures are taken
    figures_ = floor_figures(arrivals, 500.0, tuned, target=0.8, waited_wake_s=400.0)
    # THEN the target is out of reach, and a cheaper wake is named that would bring it within
    assert figures_["gpu_target_within_reach"] is False
    assert figures_["wake_gpu_s_for_target"] < 500.0
    assert keep_alive_floor_s(arrivals, figures_["wake_gpu_s_for_target"]) <= 0.8 * tuned["cheap"] * 3600
    # and with the jobs waiting each wake (only the pool's replacement paid beyond the session) the floor is lower
    assert figures_["gpu_hours_jobs_waiting_each_wake"] == pytest.approx(800.0 / 3600, abs=1e-3)


def test_a_wake_from_the_pool_costs_what_the_keep_alive_prices_it_at() -> None:
    # GIVEN the modelled cold start of the stack's default model
    cold = figures.ColdStart(model_download_s=QWEN2_5_1_5B.weight_bytes() / figures.MODEL_DOWNLOAD_BYTES_PER_S)
    # WHEN a wake from the pre-initialized pool is priced (its start to serving, and the replacement's initialization)
    price = wake_gpu_s(cold, warm_pool=True)
    # THEN it is the price the learned keep-alive is deployed with, to within a few seconds
    assert price == pytest.approx(KeepAlivePolicy().cold_start_gpu_s, abs=5.0)
    # and the pool's wake costs more GPU than a fresh instance's, which launches no replacement
    assert wake_gpu_s(cold, warm_pool=False) < price
    # and of it, what jobs that wait the wake do not save is the replacement's initialization: boot, pull, download
    assert replacement_gpu_s(cold, warm_pool=True) == pytest.approx(
        cold.instance_boot_s + cold.image_pull_s + cold.model_download_s
    )
    assert replacement_gpu_s(cold, warm_pool=False) == 0.0


def test_the_best_fixed_keep_alive_keeps_through_the_pauses_a_wake_costs_more_than() -> None:
    # GIVEN submissions with gaps of 100, 200 and 5,000 s and a wake that costs 500 GPU-seconds
    arrivals = [0.0, 100.0, 300.0, 5300.0]
    # WHEN the best single keep-alive is sought
    keep_alive, gpu_s = best_fixed_keep_alive(arrivals, 500.0)
    # THEN it keeps through the two short gaps and lets go soon after the long one began: 200 s, costing the first
    # wake, 100 + 200 kept, 200 + a wake for the long gap and 200 after the last submission
    assert keep_alive == 200.0
    assert gpu_s == 500.0 + 100.0 + 200.0 + (200.0 + 500.0) + 200.0
    # and no single keep-alive costs less than knowing each gap
    assert gpu_s >= keep_alive_floor_s(arrivals, 500.0)
