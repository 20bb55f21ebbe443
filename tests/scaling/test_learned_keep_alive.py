"""The learned keep-alive in the simulated stack: the synthesized template's function, decided every minute."""

from __future__ import annotations

import copy

from bench.scaling.engine import EngineModel
from bench.scaling.figures import ColdStart
from bench.scaling.keda import read_scaled_object
from bench.scaling.policies import scenarios
from bench.scaling.simulation import simulate
from bench.scaling.template import read
from bench.scaling.trace import Request
from cdk.capacity import A10G, QWEN2_5_1_5B, kv_cache_tokens

ENGINE = EngineModel(QWEN2_5_1_5B, A10G, max_num_seqs=135, kv_cache_tokens=kv_cache_tokens(QWEN2_5_1_5B, A10G))


def bursts(count: int, every_s: float, jobs: int = 20) -> list[Request]:
    """``count`` bursts of ``jobs`` short jobs within 10 s, one every ``every_s``."""
    return [Request(b * every_s + j * 10 / jobs, 200, 50) for b in range(count) for j in range(jobs)]


def without_keep_alive_function(template: dict) -> dict:
    """The template with the keep-alive function unable to publish (its decision never reaches the alarm)."""
    variant = copy.deepcopy(template)
    for resource in variant["Resources"].values():
        if resource["Type"] == "AWS::IAM::Policy":
            statements = resource["Properties"]["PolicyDocument"]["Statement"]
            statements[:] = [s for s in statements if s["Action"] != "cloudwatch:PutMetricData"]
    return variant


def wakes(template: dict, requests: list[Request]) -> int:
    """How often the deployed stack was woken from zero (the API's wake calls) for ``requests``."""
    [scenario] = scenarios(template, max_tasks=2, keda_spec=read_scaled_object(), cpu_vcpus=4.0, only=("deployed",))
    run = simulate(scenario, requests, ENGINE, read(template).cluster, ColdStart(), ttl_s=86_400.0, tail_s=600.0)
    return run.api_wake_calls


def test_pauses_shorter_than_a_cold_start_is_worth_keep_the_last_task(stack_template):
    # GIVEN bursts 6 minutes apart (5-minute pauses, longer than the fixed 3-minute keep-alive, shorter than a cold
    # start's worth) WHEN simulated on the stack THEN one wake: the learned keep-alive keeps the task through every
    # pause; without its decision, the fixed keep-alive lets it go in every pause the wake's 7-minute hold does not
    # cover (every other one)
    trace = bursts(8, 360.0)
    assert wakes(stack_template, trace) == 1
    assert wakes(without_keep_alive_function(stack_template), trace) >= 4


def test_pauses_far_longer_than_a_cold_start_is_worth_let_the_task_go(stack_template):
    # GIVEN bursts an hour apart WHEN simulated on the stack THEN every burst wakes the stack: an hour warm costs more
    # than a cold start, so the task goes after each
    assert wakes(stack_template, bursts(4, 3600.0)) == 4
