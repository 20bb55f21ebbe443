"""One synthesized app for the whole test session, built exactly as app.py builds it, from cdk.json's context.

cdk.json's context carries the feature flags (without them the ASG would fall back to a launch configuration), so
the app is built with it, plus a few test options: an extra tenant and one subscription of each protocol. If the
worker's Dockerfile does not exist yet, a placeholder build context in a temp dir stands in (only staged, never built).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from app import build
from async_inference.catalog_template import function_variables

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
    outdir: Path

    @functools.cached_property
    def json(self) -> dict[str, Any]:
        return self.template.to_json()

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return self.template.find_resources(type_)

    def variables(self, function: str) -> dict[str, Any]:
        """The environment of the function whose logical id or handler is ``function``, with what it reads from the
        deployment's catalog (``async_inference.catalog_template``): what its code sees."""
        functions = self.resources("AWS::Lambda::Function")
        [logical_id] = [k for k, v in functions.items() if function in (k, v["Properties"].get("Handler"))]
        return function_variables(self.json, logical_id)

    def logical_id(self, construct: Any) -> str:
        return self.stack.get_logical_id(construct.node.default_child)

    def container(self) -> dict[str, Any]:
        """The worker's container definition."""
        [task] = self.resources("AWS::ECS::TaskDefinition").values()
        [container] = task["Properties"]["ContainerDefinitions"]
        return container

    def worker_environment(self) -> dict[str, Any]:
        return {variable["Name"]: variable["Value"] for variable in self.container()["Environment"]}

    def docker_images(self) -> list[dict[str, Any]]:
        """The Docker image assets of the stack, as the asset manifest describes them (platform included)."""
        manifest = json.loads((self.outdir / f"{self.stack.artifact_id}.assets.json").read_text())
        return list(manifest.get("dockerImages", {}).values())


def _synthesize(context: dict[str, Any], outdir: Path, region: str | None = None) -> Synthesized:
    """Build the app as app.py does (cdk-nag included), environment-agnostic unless ``region`` is given."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CDK_DEFAULT_ACCOUNT", raising=False)
        patch.delenv("CDK_DEFAULT_REGION", raising=False)
        if region:
            patch.setenv("CDK_DEFAULT_ACCOUNT", "111122223333")
            patch.setenv("CDK_DEFAULT_REGION", region)
        app = App(context=context, outdir=str(outdir))
        stack = build(app)
        # Synthesizes with the cdk-nag plugin: an unacknowledged finding raises here.
        template = Template.from_stack(stack)
    return Synthesized(stack=stack, template=template, outdir=outdir)


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
    # An unacknowledged cdk-nag finding raises here and fails every test.
    context = {**cdk_json_context(), **TEST_CONTEXT, "worker_image_context": str(worker_context)}
    return _synthesize(context, tmp_path_factory.mktemp("cdk.out"))


@pytest.fixture(scope="session")
def synth_variant(worker_context: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Synthesized]:
    """``synth_variant(region=None, **options)``: the app with cdk.json's context plus ``options``, each distinct
    combination synthesized once per session (about 3 s each after the first)."""
    cache: dict[str, Synthesized] = {}

    def synthesize(region: str | None = None, **options: Any) -> Synthesized:
        key = json.dumps([region, options], sort_keys=True, default=str)
        if key not in cache:
            context = {**cdk_json_context(), "worker_image_context": str(worker_context), **options}
            cache[key] = _synthesize(context, tmp_path_factory.mktemp("cdk.out.variant"), region)
        return cache[key]

    return synthesize


@pytest.fixture(scope="session")
def template(synthesized: Synthesized) -> Template:
    return synthesized.template
