"""Synthesizes the CDK app into a cloud assembly, as ``cdk synth`` does, for tests and tools that need one with their
own context (``make synth`` runs the CDK CLI itself and writes ``cdk.out/``).

The context is cdk.json's (its feature flags shape the template) with ``overrides`` on top, the way ``-c name=value``
adds to it on the command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# What the CDK CLI adds to the context of every synth: the asset metadata is how a template names its assets' staged
# directories (aws:asset:path), which the local runtime runs functions and the worker from.
CLI_CONTEXT = {"aws:cdk:enable-asset-metadata": True, "aws:cdk:enable-path-metadata": True}


def cdk_json_context() -> dict[str, Any]:
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def synthesize(outdir: Path | str, overrides: dict[str, Any] | None = None) -> Path:
    """The app synthesized into ``outdir`` (cdk-nag's checks included, as in every synth); ``outdir``."""
    from aws_cdk import App  # the CDK (and its Node.js runtime) only when a synth is asked for

    from app import build

    app = App(context={**CLI_CONTEXT, **cdk_json_context(), **(overrides or {})}, outdir=str(outdir))
    build(app)
    app.synth()
    return Path(outdir)
