"""Shared fixtures for the scaling simulator's tests: the synthesized stack (once a session) and small engines."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cdk_json_context() -> dict[str, Any]:
    return json.loads((ROOT / "cdk.json").read_text())["context"]


@pytest.fixture(scope="session")
def stack_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The template app.py synthesizes from cdk.json's context (as tests/cdk/conftest.py builds it)."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App
    from aws_cdk.assertions import Template

    from app import build

    app = App(context=cdk_json_context(), outdir=str(tmp_path_factory.mktemp("cdk.out")))
    return Template.from_stack(build(app)).to_json()


@functools.cache
def _scaling_template(options: tuple[tuple[str, Any], ...]) -> str:
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App, Stack
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_ecs as ecs
    from aws_cdk import aws_sqs as sqs
    from aws_cdk.assertions import Template

    from cdk.queue_scaling import QueueScaling

    stack = Stack(App(), "Scaling")
    cluster = ecs.Cluster(stack, "Cluster")
    cluster.add_capacity("Capacity", instance_type=ec2.InstanceType("g5.xlarge"))
    task = ecs.Ec2TaskDefinition(stack, "Task")
    task.add_container("worker", image=ecs.ContainerImage.from_registry("worker"), memory_reservation_mib=256)
    service = ecs.Ec2Service(stack, "Service", cluster=cluster, task_definition=task)
    # No functions' code in this bare stack: the learned keep-alive only when a test passes code.
    options = (("learned_keep_alive", False), *options)
    QueueScaling(stack, "Scaling", service=service, queues=[sqs.Queue(stack, "Jobs")], **dict(options))
    return json.dumps(Template.from_stack(stack).to_json())


def scaling_policy(**options: Any):
    """The policy cdk.queue_scaling.QueueScaling synthesizes with ``options`` (jobs_per_task, max_tasks, ...), read
    back as the simulator reads the stack's: the construct itself, not a copy of it."""
    from bench.scaling.template import read_policy

    return read_policy(json.loads(_scaling_template(tuple(sorted(options.items())))))
