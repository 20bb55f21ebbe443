"""The scaling simulator on a stack of several models (issue 20): each model's fleet read apart from the template
and simulated with its own policy, capacity and wake."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from bench.scaling.engine import EngineModel
from bench.scaling.figures import ColdStart
from bench.scaling.keda import read_scaled_object
from bench.scaling.policies import scenarios
from bench.scaling.simulation import simulate
from bench.scaling.template import WORKER_ECS_SERVICE_NAME, fleet_templates, read, read_fleets
from bench.scaling.trace import AZURE_CONVERSATION, load
from cdk.capacity import A10G, QWEN2_5_1_5B, kv_cache_tokens
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
    own maximum, instances, batch and model, and each woken by the functions that queue work (the further one
    through its MODEL_FLEETS route)."""
    fleets = read_fleets(two_fleets)
    assert list(fleets) == ["gpu-workers", "gpu-workers-second-model"]
    first, second = fleets.values()
    assert (first.policy.maximum, first.cluster.max_instances, first.worker.max_num_seqs) == (2, 2, 135)
    assert (second.policy.maximum, second.cluster.max_instances, second.worker.max_num_seqs) == (1, 1, 64)
    assert (first.worker.model, second.worker.model) == (FIRST, SECOND["name"])
    assert first.wake is not None and second.wake is not None
    assert first.wake.functions == second.wake.functions and len(second.wake.functions) == 3
    assert second.cluster.release_empty  # the first fleet's release function releases the shared cluster's groups
    with pytest.raises(ValueError, match="expected one ECS ScalableTarget"):
        read(two_fleets)  # the whole template is several fleets: read one at a time


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
