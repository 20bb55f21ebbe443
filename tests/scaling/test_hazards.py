"""The three hazard scenarios (bench/scaling/hazards.py) on the synthesized stack, fixed and with the fix undone: each
outcome differs, so each scenario can fail. Then the hold's maximum: on the conversation trace's opening burst and on
a burst one task cannot clear, with and without it."""

from __future__ import annotations

from typing import Any

import pytest

from bench.scaling.counterfactuals import without as _without
from bench.scaling.engine import EngineModel
from bench.scaling.figures import ColdStart
from bench.scaling.hazards import burst, setting, unfixed
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


def test_a_wake_holds_the_service_at_one_task_through_an_opening_burst_that_one_task_clears(stack_template, requests):
    # GIVEN the conversation trace's first 20 minutes from an idle stack (12.7 % of its jobs come in the 134 s before
    # the first task serves)
    trace = [r for r in requests if r.arrival_s < 1200]
    # WHEN the stack wakes THEN the count stays at one task through the hold, and the burst is still served with no
    # job waiting longer than it would with a second task asked for at once
    held = _deployed(stack_template, trace, Delays())
    unheld = _deployed(_without(stack_template, "hold_cap"), trace, Delays())
    assert held.max_tasks == 1
    # AND without the hold's maximum a second task (and a fresh GPU instance) is asked for that never serves a job
    assert unheld.max_tasks == 2
    assert held.gpu_hours < unheld.gpu_hours
    assert max(j.started_s - j.submitted_s for j in held.jobs) <= max(j.started_s - j.submitted_s for j in unheld.jobs)


def test_a_burst_one_task_cannot_clear_still_gets_its_second_task_after_the_hold(stack_template, requests):
    # GIVEN 4,000 of the trace's jobs arriving within 5 minutes of an idle stack
    trace = burst(requests[:4000])
    # WHEN the stack wakes THEN a second task is asked for once the hold ends (the scale-out alarm, still in ALARM,
    # re-runs its action), later than without the hold's maximum, and the burst is done no later (the second task
    # starts from the pool's replacement, ready about then, instead of a fresh instance)
    held = _deployed(stack_template, trace, Delays())
    unheld = _deployed(_without(stack_template, "hold_cap"), trace, Delays())
    assert held.max_tasks == unheld.max_tasks == 2
    hold_s = read(stack_template).wake.hold_s
    assert _second_task_asked_at(unheld) < hold_s <= _second_task_asked_at(held)
    assert all(j.finished_s is not None for j in held.jobs)
    assert max(j.finished_s for j in held.jobs) <= max(j.finished_s for j in unheld.jobs)


def _second_task_asked_at(run) -> float:
    return next(now for now, desired, *_ in run.timeline if desired >= 2)
