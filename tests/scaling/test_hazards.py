"""The three hazard scenarios (bench/scaling/hazards.py) on the synthesized stack, fixed and with the fix undone: each
outcome differs, so each scenario can fail."""

from __future__ import annotations

from typing import Any

import pytest

from bench.scaling.engine import EngineModel
from bench.scaling.figures import ColdStart
from bench.scaling.hazards import setting, unfixed
from bench.scaling.keda import read_scaled_object
from bench.scaling.policies import scenarios
from bench.scaling.simulation import Delays, simulate
from bench.scaling.template import read
from bench.scaling.trace import AZURE_CONVERSATION, load
from cdk.capacity import A10G, QWEN2_5_1_5B, kv_cache_tokens


@pytest.fixture(scope="module")
def requests():
    return load(AZURE_CONVERSATION)


def _deployed(template: dict[str, Any], trace, delays: Delays):
    deployed = read(template)
    [scenario] = scenarios(
        template, max_tasks=deployed.policy.maximum, keda_spec=read_scaled_object(), cpu_vcpus=4.0, only=("deployed",)
    )
    engine = EngineModel(
        QWEN2_5_1_5B,
        A10G,
        max_num_seqs=deployed.worker.max_num_seqs,
        kv_cache_tokens=kv_cache_tokens(QWEN2_5_1_5B, A10G),
    )
    return simulate(scenario, trace, engine, deployed.cluster, ColdStart(), ttl_s=86400, tail_s=900, delays=delays)


def test_the_wake_survives_the_idle_alarm(stack_template, requests):
    # GIVEN a queue used an hour ago (publishing zeros, the keep-alive in ALARM) and SQS datapoints 2 minutes late
    trace, (delays,) = setting("wake_vs_idle_alarm", requests)
    # WHEN a job wakes the stack THEN no scale-to-zero undoes the wake while jobs wait; without the hold, one does
    assert _deployed(stack_template, trace, delays).zeroed_while_waiting == 0
    assert _deployed(unfixed(stack_template), trace, delays).zeroed_while_waiting >= 1


def test_the_fleet_never_goes_to_zero_while_jobs_wait_unpublished(stack_template, requests):
    # GIVEN a queue idle for over six hours, whose metrics resume 15 minutes after the first message
    trace, (delays,) = setting("inactive_queue_resume", requests)
    # WHEN the trace runs THEN the count never drops to 0 with jobs waiting; reading missing data as idle, it does
    assert _deployed(stack_template, trace, delays).zeroed_while_waiting == 0
    assert _deployed(unfixed(stack_template), trace, delays).zeroed_while_waiting >= 1


def test_a_cold_start_asks_for_one_task_whether_or_not_desired_is_published(stack_template, requests):
    # GIVEN a backlog one task holds, and either reading of whether DesiredTaskCount is published while it starts
    trace, readings = setting("desired_unpublished_cold_start", requests)
    for delays in readings:
        # WHEN the stack wakes THEN one task is asked for before the first serves
        assert _deployed(stack_template, trace, delays).most_desired_before_first_task == 1
    # AND adding the shortfall to an unpublished count (read as 0) asks for a second
    unpublished = next(d for d in readings if not d.desired_while_starting)
    assert _deployed(unfixed(stack_template), trace, unpublished).most_desired_before_first_task == 2
