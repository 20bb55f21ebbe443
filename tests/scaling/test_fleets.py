"""The scaling simulator on a stack of several models (issue 20): each model's fleet read apart from the template
and simulated with its own policy, capacity and wake."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest

from bench.scaling.engine import EngineModel, fleet_shape
from bench.scaling.figures import ColdStart
from bench.scaling.keda import read_scaled_object
from bench.scaling.policies import scenarios
from bench.scaling.report import summarise
from bench.scaling.simulation import simulate
from bench.scaling.template import WORKER_ECS_SERVICE_NAME, fleet_templates, read, read_fleets
from bench.scaling.trace import AZURE_CONVERSATION, embedding_requests, load
from cdk.capacity import A10G, INSTANCE_GPUS, QWEN2_5_1_5B, EncoderShape, kv_cache_tokens
from tests.scaling.conftest import cdk_json_context

FIRST = "Qwen/Qwen2.5-1.5B-Instruct"
# A second model of the same shape (cdk.capacity knows one), its fleet smaller: one task, one instance, 64 a batch.
SECOND = {"name": "org/second-model", "max_num_seqs": 64, "max_worker_tasks": 1, "max_gpu_instances": 1}


@pytest.fixture(scope="module")
def two_fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from app import build

    context = {**cdk_json_context(), "models": json.dumps([{"name": FIRST}, SECOND])}
    app = App(context=context, outdir=str(tmp_path_factory.mktemp("cdk.out.fleets")))
    return Template.from_stack(build(app)).to_json()


def test_the_cdk_and_the_simulator_agree_on_the_first_models_service_name():
    """GIVEN the simulator's copy of the first model's service name WHEN compared THEN it is the stack's."""
    from cdk.gpu_worker_service import WORKER_ECS_SERVICE_NAME as STACK_NAME

    assert WORKER_ECS_SERVICE_NAME == STACK_NAME


def test_each_fleet_is_read_with_its_own_policy_capacity_worker_and_wake(two_fleets):
    """GIVEN a two-model template WHEN each fleet is read THEN the first model's fleet is read first, each with its
    own maximum, instances, batch and model, and each woken by the functions that queue work through its
    MODEL_FLEETS route."""
    fleets = read_fleets(two_fleets)
    assert list(fleets) == ["gpu-workers", "gpu-workers-second-model"]
    first, second = fleets.values()
    assert (first.policy.maximum, first.cluster.max_instances, first.worker.max_num_seqs) == (2, 2, 135)
    assert (second.policy.maximum, second.cluster.max_instances, second.worker.max_num_seqs) == (1, 1, 64)
    assert (first.worker.model, second.worker.model) == (FIRST, SECOND["name"])
    assert first.wake is not None and second.wake is not None
    assert first.wake.functions == second.wake.functions and len(second.wake.functions) == 4
    assert first.wake.starts_instance and second.wake.starts_instance  # each group through its route
    # the first fleet's pool (1) starts fewer than its 2 tasks: the hold keeps its maximum at 1; the second's (1)
    # starts its one task: no maximum held
    assert (first.wake.hold_max_tasks, second.wake.hold_max_tasks) == (1, None)
    assert second.cluster.release_empty  # the first fleet's release function releases the shared cluster's groups
    with pytest.raises(ValueError, match="expected one ECS ScalableTarget"):
        read(two_fleets)  # the whole template is several fleets: read one at a time


def test_a_second_fleets_hold_maximum_is_read_from_its_route(tmp_path):
    """GIVEN a second fleet of up to 3 tasks with a warm pool of 1 WHEN its fleet is read THEN its wake holds the
    maximum at 1 (the route's worker_hold_max_tasks), as the first fleet's does from its own."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from app import build

    larger = {**SECOND, "max_worker_tasks": 3, "max_gpu_instances": 3}
    context = {**cdk_json_context(), "models": json.dumps([{"name": FIRST}, larger])}
    template = Template.from_stack(build(App(context=context, outdir=str(tmp_path)))).to_json()
    first, second = read_fleets(template).values()
    assert (first.wake.hold_max_tasks, second.wake.hold_max_tasks) == (1, 1)


def test_each_fleet_runs_in_the_simulator_within_its_own_ceiling(two_fleets):
    """GIVEN each fleet's template WHEN its deployed policy runs the first 300 jobs of the Azure trace THEN every job
    is served, and no fleet asks for more tasks than its own maximum."""
    requests = load(AZURE_CONVERSATION)[:300]
    for name, template in fleet_templates(two_fleets).items():
        deployed = read(template)
        [scenario] = scenarios(
            template,
            max_tasks=deployed.policy.maximum,
            keda_spec=read_scaled_object(),
            cpu_vcpus=4.0,
            only=("deployed",),
        )
        engine = EngineModel(
            QWEN2_5_1_5B,
            A10G,
            max_num_seqs=deployed.worker.max_num_seqs,
            kv_cache_tokens=kv_cache_tokens(QWEN2_5_1_5B, A10G),
        )
        run = simulate(scenario, requests, engine, deployed.cluster, ColdStart(), ttl_s=86400, tail_s=900)
        assert all(job.finished_s is not None for job in run.jobs) and len(run.jobs) == len(requests), name
        assert 1 <= run.max_tasks <= deployed.policy.maximum, name


# The three-model stack of tests/e2e/test_model_fleets.py: a chat model, a second chat model, an embedding model.
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDING = "sentence-transformers/all-MiniLM-L6-v2"
THREE = [
    {"name": FIRST},
    {"name": SMOL, "max_num_seqs": 16, "max_worker_tasks": 1, "max_gpu_instances": 1},
    {"name": EMBEDDING, "kind": "embedding", "max_num_seqs": 64, "max_worker_tasks": 1, "max_gpu_instances": 1},
]


@pytest.fixture(scope="module")
def three_fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from app import build

    context = {**cdk_json_context(), "models": json.dumps(THREE)}
    app = App(context=context, outdir=str(tmp_path_factory.mktemp("cdk.out.three")))
    return Template.from_stack(build(app)).to_json()


def test_each_of_three_fleets_has_an_engine_and_the_embedding_fleet_runs_prefill_only(three_fleets):
    """GIVEN the three-model template WHEN each fleet's deployed policy runs the first 300 jobs of the Azure trace on
    its own model's engine THEN every fleet has a shape (none skipped), every job is served, and the embedding fleet's
    jobs are prefills of at most 256 tokens with finite, positive GPU hours and waits."""
    requests = load(AZURE_CONVERSATION)[:300]
    deployed = read_fleets(three_fleets)
    assert [(d.worker.model, d.worker.kind) for d in deployed.values()] == [
        (FIRST, "chat"),
        (SMOL, "chat"),
        (EMBEDDING, "embedding"),
    ]
    summaries = {}
    for name, template in fleet_templates(three_fleets).items():
        fleet = deployed[name]
        shape = fleet_shape(fleet.worker.model, fleet.worker.kind)
        assert shape is not None, name
        gpu = INSTANCE_GPUS[fleet.worker.instance_type][0]
        encoder = isinstance(shape, EncoderShape)
        jobs = embedding_requests(requests, shape.max_tokens) if encoder else requests
        kv_tokens = 0 if encoder else kv_cache_tokens(shape, gpu)
        engine = EngineModel(shape, gpu, max_num_seqs=fleet.worker.max_num_seqs, kv_cache_tokens=kv_tokens)
        [scenario] = scenarios(
            template, max_tasks=fleet.policy.maximum, keda_spec=read_scaled_object(), cpu_vcpus=4.0, only=("deployed",)
        )
        run = simulate(scenario, jobs, engine, fleet.cluster, ColdStart(), ttl_s=86400, tail_s=900)
        assert all(job.finished_s is not None for job in run.jobs) and len(run.jobs) == len(requests), name
        summaries[fleet.worker.model] = (run, summarise(run, instance_type=fleet.worker.instance_type, alarm_metrics=0))
    run, summary = summaries[EMBEDDING]
    assert all(job.generated_tokens == 0 and 1 <= job.context_tokens <= 256 for job in run.jobs)
    for key in ("gpu_hours", "p50_wait_s", "p95_wait_s", "p99_wait_s"):
        assert 0 < summary[key] < math.inf, key
    # an embedding is one prefill: once started, a job is done within a second (steps of a few ms)
    assert max(job.finished_s - job.started_s for job in run.jobs) < 1.0


def test_the_simulator_command_simulates_every_fleet_of_the_three_model_stack(three_fleets, tmp_path, capsys):
    """GIVEN the three-model template WHEN ``python -m bench.scaling`` runs on it (200 jobs, no sensitivity rows)
    THEN no fleet is skipped: each writes its own results, the embedding fleet's with finite, positive GPU hours."""
    from bench.scaling.__main__ import main

    path = tmp_path / "three.json"
    path.write_text(json.dumps(three_fleets))
    out = tmp_path / "out"
    assert (
        main(["--template", str(path), "--limit", "200", "--no-sensitivity", "--generated", "", "--out", str(out)]) == 0
    )
    assert "skipped" not in capsys.readouterr().out
    # one results file per fleet, named scaling-<time>-<trace>-<fleet>.json
    documents = {p.stem.split("-", 3)[3]: json.loads(p.read_text()) for p in sorted(out.glob("scaling-*.json"))}
    assert sorted(documents) == sorted(fleet_templates(three_fleets))
    embedding = documents["gpu-workers-all-minilm-l6-v2"]["policies"]["deployed"]
    assert 0 < embedding["gpu_hours"] < math.inf and 0 < embedding["p95_wait_s"] < math.inf


def test_an_embedding_engine_packs_whole_prompts_up_to_the_token_budget_in_one_step_each():
    """GIVEN all-MiniLM-L6-v2's engine and nine 256-token embedding jobs at once WHEN it runs THEN the first eight
    (2,048 tokens, the step's budget) end together after one prefill step and the ninth after one more; no decode."""
    import simpy

    from bench.scaling.engine import Engine
    from bench.scaling.queue import Job
    from cdk.capacity import MINILM_L6_V2

    env = simpy.Environment()
    model = EngineModel(MINILM_L6_V2, A10G, max_num_seqs=64, kv_cache_tokens=0)
    done: dict[int, float] = {}
    engine = Engine(env, model, on_start=lambda job: None, on_done=lambda job: done.setdefault(job.index, env.now))
    for index in range(9):
        engine.submit(Job(index, 0.0, 256, 0, 86400.0))
    env.run(until=1.0)
    full, one = model.step_s(0, 0.0, 2048, 256), model.step_s(0, 0.0, 256, 256)
    assert [done[i] for i in range(8)] == pytest.approx([full] * 8)
    assert done[8] == pytest.approx(full + one)
    assert engine.busy_s == pytest.approx(full + one) and not engine.busy
    # the step is the roofline's: the overhead plus 2 x 22.7M FLOPs a token and attention over the whole input
    assert full > one > model.step_overhead_s
