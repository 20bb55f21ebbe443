"""Nested stacks deployed locally (local_runtime.nested): a parent and a nested stack that refer to each other's
resources, synthesized by the CDK, deployed into moto and deleted, as CloudFormation would."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from aws_cdk import App, NestedStack, Stack
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm

from local_runtime.deployer import Deployment
from local_runtime.moto_server import MotoServer
from local_runtime.nested import NESTED_STACK, inline_nested_stacks
from local_runtime.stack import LOCAL_KEYS
from local_runtime.synth import CLI_CONTEXT
from local_runtime.template import LOCAL_REGION, Assembly, TemplateError

pytestmark = pytest.mark.cdk


def _assembly(outdir: Path) -> Path:
    """A parent with a queue, and a nested stack with its own queue and a parameter naming the parent's queue; the
    parent's parameter names the nested queue (a nested stack's output)."""
    app = App(outdir=str(outdir), context=CLI_CONTEXT)
    parent = Stack(app, "Parent")
    shared = sqs.Queue(parent, "Shared")
    nested = NestedStack(parent, "Fleet")
    own = sqs.Queue(nested, "Own")
    ssm.StringParameter(nested, "SharedUrl", parameter_name="/parent/shared", string_value=shared.queue_url)
    ssm.StringParameter(parent, "OwnUrl", parameter_name="/parent/own", string_value=own.queue_url)
    app.synth()
    return outdir


def _client(moto: MotoServer, service: str):
    return boto3.client(
        service, endpoint_url=moto.url, region_name=LOCAL_REGION, **{k.lower(): v for k, v in LOCAL_KEYS.items()}
    )


def test_a_nested_stack_deploys_with_its_parent_each_reading_the_others_resources(tmp_path, moto):
    # GIVEN the assembly of a parent and its nested stack
    assembly = Assembly.load(_assembly(tmp_path))
    # THEN the nested stack is in its parent's template as its resources
    assert {r["Type"] for r in assembly.resources.values()} >= {"AWS::SQS::Queue", "AWS::SSM::Parameter"}
    assert "AWS::CloudFormation::Stack" not in {r["Type"] for r in assembly.resources.values()}
    # WHEN it is deployed
    deployment = Deployment(assembly, lambda service: _client(moto, service), api_key_values={}).deploy()
    # THEN the nested parameter holds the parent's queue's URL (a parameter of the nested stack), and the parent's
    # the nested queue's (an output of the nested stack)
    ssm_client, sqs_client = _client(moto, "ssm"), _client(moto, "sqs")
    urls = sorted(sqs_client.list_queues()["QueueUrls"])
    shared = ssm_client.get_parameter(Name="/parent/shared")["Parameter"]["Value"]
    own = ssm_client.get_parameter(Name="/parent/own")["Parameter"]["Value"]
    assert len(urls) == 2 and sorted([shared, own]) == urls
    # AND a delete removes both stacks' resources, nothing failing
    deletion = deployment.delete()
    assert deletion.failed == {} and sqs_client.list_queues().get("QueueUrls", []) == []
    assert ssm_client.describe_parameters()["Parameters"] == []


def _nested_with_sub(directory: Path, sub: object) -> dict:
    """A parent template whose one nested stack holds a queue named by ``sub`` (an ``Fn::Sub``) beside another."""
    nested = {
        "Resources": {
            "Other": {"Type": "AWS::SQS::Queue"},
            "Named": {"Type": "AWS::SQS::Queue", "Properties": {"QueueName": {"Fn::Sub": sub}}},
        }
    }
    (directory / "nested.json").write_text(json.dumps(nested))
    stack = {"Type": NESTED_STACK, "Metadata": {"aws:asset:path": "nested.json"}}
    return {"Resources": {"Fleet": stack}}


def test_an_fn_sub_of_pseudo_parameters_in_a_nested_stack_is_inlined_as_written(tmp_path):
    # GIVEN a nested stack naming a queue by an Fn::Sub of pseudo parameters only (as the CDK names its image
    # repository) WHEN it is inlined THEN the Fn::Sub is kept as written: the pseudo parameters are the parent's too
    inlined = inline_nested_stacks(tmp_path, _nested_with_sub(tmp_path, "repo-${AWS::AccountId}-${AWS::Region}"))
    assert inlined["Resources"]["FleetNamed"]["Properties"]["QueueName"] == {
        "Fn::Sub": "repo-${AWS::AccountId}-${AWS::Region}"
    }


def test_an_fn_sub_naming_a_nested_resource_is_refused_rather_than_left_unrenamed(tmp_path):
    # GIVEN a nested stack naming a queue by an Fn::Sub of another of its resources WHEN it is inlined THEN it is
    # refused naming the Fn::Sub (its ${Other} would name no resource of the parent)
    with pytest.raises(TemplateError, match="Fn::Sub"):
        inline_nested_stacks(tmp_path, _nested_with_sub(tmp_path, "copy-of-${Other.QueueName}"))
