"""The tenants in nested stacks (cdk.tenant_stacks), deployed locally: the app synthesized with ``tenant_stacks``,
its nested templates inlined and deployed into moto as CloudFormation would, then deleted."""

from __future__ import annotations

import boto3
import pytest

from async_inference.catalog import TENANTS, read_part
from local_runtime.deployer import Deployment
from local_runtime.moto_server import MotoServer
from local_runtime.stack import LOCAL_KEYS
from local_runtime.synth import synthesize
from local_runtime.template import LOCAL_REGION, Assembly

pytestmark = pytest.mark.cdk

TENANTS_IN_NESTED_STACKS = ("acme", "globex", "initech", "umbrella")


def _client(moto: MotoServer, service: str):
    return boto3.client(
        service, endpoint_url=moto.url, region_name=LOCAL_REGION, **{k.lower(): v for k, v in LOCAL_KEYS.items()}
    )


def test_tenants_in_nested_stacks_deploy_with_their_catalog_entries_queues_secrets_and_event_sources(tmp_path, moto):
    # GIVEN the app with four tenants over two nested stacks, deployed
    outdir = synthesize(
        tmp_path, {"tenants": {t: {} for t in TENANTS_IN_NESTED_STACKS}, "tenant_stacks": 2, "websocket_push": False}
    )
    assembly = Assembly.load(outdir)
    deployment = Deployment(assembly, lambda service: _client(moto, service), api_key_values={}).deploy()
    # WHEN the catalog's tenants are read as the functions read them (the stack's path, recursively)
    root = f"/{assembly.stack_name}/catalog/"
    entries = read_part(_client(moto, "ssm"), root, TENANTS)
    # THEN each tenant has its entry, naming its API key, its webhook queue and its signing secret, each deployed
    assert sorted(entries) == sorted(TENANTS_IN_NESTED_STACKS)
    sqs, secrets = _client(moto, "sqs"), _client(moto, "secretsmanager")
    # The event sources the local runtime polls, as it reads them from the deployed template (local_runtime.pollers).
    mappings = {
        m.properties["EventSourceArn"]: deployment.function_by_arn(m.properties["FunctionName"])
        for m in deployment.of_type("AWS::Lambda::EventSourceMapping").values()
    }
    for tenant, entry in entries.items():
        assert len(entry["api_key_ids"]) == 1, tenant
        queue_arn = sqs.get_queue_attributes(QueueUrl=entry["webhook_queue_url"], AttributeNames=["QueueArn"])
        assert mappings[queue_arn["Attributes"]["QueueArn"]].startswith("ServiceWebhooksHandler"), tenant
        assert secrets.get_secret_value(SecretId=entry["webhook_secret_arn"])["SecretString"], tenant
    # AND a delete removes the nested stacks' resources with the rest, nothing failing
    assert deployment.delete().failed == {}
