"""Each model's fleet in a nested stack of its own (``fleet_stacks``), deployed locally: the app synthesized with two
models so, its nested templates inlined and deployed into moto as CloudFormation would, then deleted."""

from __future__ import annotations

import boto3
import pytest

from async_inference.catalog import MODELS, read_part
from cdk import limits
from local_runtime.deployer import Deployment
from local_runtime.moto_server import MotoServer
from local_runtime.stack import LOCAL_KEYS
from local_runtime.synth import synthesize
from local_runtime.template import LOCAL_REGION, Assembly

pytestmark = pytest.mark.cdk


def _client(moto: MotoServer, service: str):
    return boto3.client(
        service, endpoint_url=moto.url, region_name=LOCAL_REGION, **{k.lower(): v for k, v in LOCAL_KEYS.items()}
    )


def test_fleets_in_nested_stacks_deploy_each_with_its_own_cluster_and_queues_and_delete(tmp_path, moto):
    # GIVEN the app with two models, each fleet in a nested stack of its own, deployed
    context = {**limits.synthetic_context(2, 2, fleet_stacks=True), "websocket_push": False}
    outdir = synthesize(tmp_path, context)
    assembly = Assembly.load(outdir)
    deployment = Deployment(assembly, lambda service: _client(moto, service), api_key_values={}).deploy()
    # WHEN the catalog's models are read as the functions read them (the stack's path, recursively)
    routes = read_part(_client(moto, "ssm"), f"/{assembly.stack_name}/catalog/", MODELS)
    # THEN each model's route names its own job queue and its own cluster, both deployed
    assert sorted(routes) == ["org/model-0", "org/model-1"]
    sqs, ecs = _client(moto, "sqs"), _client(moto, "ecs")
    clusters = {route["route"]["worker_cluster"] for route in routes.values()}
    assert len(clusters) == 2
    assert {c["clusterName"] for c in ecs.describe_clusters(clusters=sorted(clusters))["clusters"]} == clusters
    for model, entry in routes.items():
        assert sqs.get_queue_attributes(QueueUrl=entry["route"]["queue_url"], AttributeNames=["QueueArn"]), model
    # AND a delete removes the nested stacks' resources with the rest, nothing failing
    assert deployment.delete().failed == {}
