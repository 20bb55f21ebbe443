"""Shared fixtures for the scaling simulator's tests: the synthesized stack (once a session) and small engines."""

from __future__ import annotations

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
