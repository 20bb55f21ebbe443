"""One synthesized app for the whole test session, built exactly as app.py builds it, from cdk.json's context.

cdk.json's context carries the feature flags (without them the ASG would fall back to a launch configuration), so
the app is built with it, plus a few test options: an extra tenant and one subscription of each protocol. If the
worker's Dockerfile does not exist yet, a placeholder build context in a temp dir stands in (only staged, never built).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from app import build

ROOT = Path(__file__).resolve().parents[2]

TEST_CONTEXT: dict[str, Any] = {
    "tenants": {
        "demo": {"rate_limit": 10, "burst_limit": 20, "quota_per_day": 10000},
        "acme": {"rate_limit": 5, "burst_limit": 5, "quota_per_day": 500},
    },
    "subscriptions": [
        {"protocol": "email", "endpoint": "ops@example.com", "statuses": ["failed", "expired"]},
        {"protocol": "https", "endpoint": "https://hooks.example.com/jobs", "statuses": ["succeeded"]},
        {"protocol": "sqs", "endpoint": "arn:aws:sqs:us-east-1:111122223333:downstream", "raw_message_delivery": True},
    ],
}


def cdk_json_context() -> dict[str, Any]:
    return json.loads((ROOT / "cdk.json").read_text())["context"]


@dataclass
class Synthesized:
    stack: Stack
    template: Template

    @functools.cached_property
    def json(self) -> dict[str, Any]:
        return self.template.to_json()

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return self.template.find_resources(type_)

    def logical_id(self, construct: Any) -> str:
        return self.stack.get_logical_id(construct.node.default_child)


@pytest.fixture(scope="session")
def worker_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (ROOT / "gpu_worker" / "Dockerfile").is_file():
        return ROOT
    context = tmp_path_factory.mktemp("worker-context")
    (context / "gpu_worker").mkdir()
    (context / "gpu_worker" / "Dockerfile").write_text("FROM scratch\n")
    return context


@pytest.fixture(scope="session")
def synthesized(worker_context: Path, tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    context = {**cdk_json_context(), **TEST_CONTEXT, "worker_image_context": str(worker_context)}
    app = App(context=context, outdir=str(tmp_path_factory.mktemp("cdk.out")))
    stack = build(app)
    # Synthesizes once with the cdk-nag plugin: an unacknowledged finding raises here and fails every test.
    template = Template.from_stack(stack)
    return Synthesized(stack=stack, template=template)


@pytest.fixture(scope="session")
def template(synthesized: Synthesized) -> Template:
    return synthesized.template
