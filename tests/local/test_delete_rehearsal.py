"""A stack delete, rehearsed (issue 27, finding 4): the synthesized template deployed into moto, then deleted the way
CloudFormation deletes it (local_runtime.deletion). What stays is exactly what is retained on purpose, each documented
in docs/deploying.md with the command that removes it."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from local_runtime.deletion import Deletion
from local_runtime.deployer import Deployment
from local_runtime.moto_server import MotoServer
from local_runtime.stack import LOCAL_KEYS
from local_runtime.template import LOCAL_REGION, Assembly, deployment_order

ROOT = Path(__file__).resolve().parents[2]
# What a delete leaves on purpose (destroy_data_on_delete off): the jobs' data and the key that encrypts the result
# notifications. API Gateway's account-wide logging role is the account's own by default (not created, not deleted).
RETAINED = {
    "AWS::S3::Bucket": 2,  # the claim-check bucket and its access-log bucket
    "AWS::DynamoDB::Table": 2,  # jobs and batches (the job event log, a day of streamed text, goes with the stack)
    "AWS::KMS::Key": 1,  # the result topics' key
}


def _clients(moto: MotoServer) -> Callable[[str], Any]:
    def client(service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=moto.url,
            region_name=LOCAL_REGION,
            **{k.lower(): v for k, v in LOCAL_KEYS.items()},
        )

    return client


def _deploy(assembly_dir: Path, moto: MotoServer) -> Deployment:
    return Deployment(Assembly.load(assembly_dir), _clients(moto), api_key_values={}).deploy()


@pytest.fixture
def deleted(local_assembly: Path, moto: MotoServer) -> tuple[Deployment, Deletion]:
    deployment = _deploy(local_assembly, moto)
    return deployment, deployment.delete()


def test_a_delete_leaves_exactly_what_is_retained_on_purpose(deleted):
    # GIVEN the template deployed WHEN the stack is deleted THEN nothing fails, and what stays is the retained list
    deployment, deletion = deleted
    assert deletion.failed == {}
    assert deletion.retained_types() == RETAINED
    # and each retained resource is retained on replacement too (an update that replaced it would delete its data)
    assert {r.logical_id: r.update_replace_policy for r in deletion.retained} == {
        r.logical_id: "Retain" for r in deletion.retained
    }
    # and moto holds no queue, topic, secret, log group or ECS service of the stack any more
    client = deployment.client
    assert client("sqs").list_queues().get("QueueUrls", []) == []
    assert client("sns").list_topics()["Topics"] == []
    assert client("secretsmanager").list_secrets()["SecretList"] == []
    assert client("logs").describe_log_groups()["logGroups"] == []
    clusters = client("ecs").list_clusters()["clusterArns"]  # moto lists a deleted cluster, as INACTIVE
    assert {c["status"] for c in client("ecs").describe_clusters(clusters=clusters)["clusters"]} <= {"INACTIVE"}
    retained_tables = sorted(r.physical_id for r in deletion.retained if r.type == "AWS::DynamoDB::Table")
    assert sorted(client("dynamodb").list_tables()["TableNames"]) == retained_tables


def test_every_resource_goes_before_what_it_depends_on(deleted):
    # GIVEN the delete's order WHEN comparing it with the template's dependencies THEN each resource was deleted
    # before every resource it refers to or depends on (the protection releases before the service and the group)
    deployment, deletion = deleted
    resources = deployment.assembly.resources
    position = {logical_id: index for index, logical_id in enumerate(deletion.deleted)}
    order = deployment_order(resources)
    for logical_id in deletion.deleted:
        # deployment_order puts each resource after its dependencies; the delete must mirror it exactly
        for earlier in order[: order.index(logical_id)]:
            if earlier in position and _depends(resources, logical_id, earlier):
                assert position[earlier] > position[logical_id], f"{earlier} deleted before {logical_id}"
    releases = [lid for lid in deletion.deleted if resources[lid]["Type"] == "Custom::WorkerTaskProtectionRelease"]
    services = [lid for lid in deletion.deleted if resources[lid]["Type"] == "AWS::ECS::Service"]
    assert releases and max(position[r] for r in releases) < min(position[s] for s in services)


def _depends(resources: dict[str, Any], logical_id: str, other: str) -> bool:
    resource = resources[logical_id]
    depends_on = resource.get("DependsOn", [])
    depends_on = [depends_on] if isinstance(depends_on, str) else depends_on
    text = json.dumps(resource.get("Properties", {}))
    return other in depends_on or f'"Ref": "{other}"' in text or f'["{other}", ' in text


def test_every_retained_type_is_documented_with_the_command_that_removes_it():
    # GIVEN docs/deploying.md's "What a delete leaves" WHEN reading its table THEN each retained type has a row that
    # gives a command (in backticks)
    text = (ROOT / "docs" / "deploying.md").read_text()
    section = text.split("## What a delete leaves", 1)[1].split("\n## ", 1)[0]
    for resource_type in RETAINED:
        rows = [line for line in section.splitlines() if line.startswith("|") and resource_type in line]
        assert rows and re.search(r"`aws [^`]+`", rows[0]), f"{resource_type} has no row with its command"


def test_a_bucket_that_still_holds_objects_fails_its_delete_as_cloudformation_would(
    local_assembly: Path, moto: MotoServer, tmp_path: Path
):
    # GIVEN the claim-check bucket with DeletionPolicy Delete (as destroy_data_on_delete would not leave it: its
    # auto-delete empties it first) and an object in it
    copy = tmp_path / "assembly"
    shutil.copytree(local_assembly, copy)
    assembly = Assembly.load(copy)
    [template_file] = copy.glob("*.template.json")
    template = json.loads(template_file.read_text())
    buckets = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::S3::Bucket"]
    for lid in buckets:
        template["Resources"][lid]["DeletionPolicy"] = "Delete"
    template_file.write_text(json.dumps(template))
    deployment = _deploy(copy, moto)
    del assembly
    bucket = deployment.resources[buckets[0]].ref
    deployment.client("s3").put_object(Bucket=bucket, Key="left/behind", Body=b"x")
    # WHEN the stack is deleted
    deletion = deployment.delete()
    # THEN that bucket's delete fails, naming it, and the rest is deleted
    assert list(deletion.failed) == [buckets[0]] and bucket in deletion.failed[buckets[0]]
    assert set(buckets[1:]) <= set(deletion.deleted)
