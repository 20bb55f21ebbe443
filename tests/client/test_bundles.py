"""The service imports its wire models from the client package, so what ships the service ships that package too: the
Lambda functions' source asset and the worker image."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from cdk.lambda_code import LambdaCode, _stage_sources

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the functions import first: the core with its schemas, the batch service, the push function's core.
CORE_MODULES = "async_inference.jobs_service, async_inference.batches.service, async_inference.push"


def _names(requirements: list[str]) -> set[str]:
    return {
        re.split(r"[\s\[<>=~!;]", line.strip(), maxsplit=1)[0].lower().replace("-", "_")
        for line in requirements
        if line.split("#")[0].strip()
    }


def client_only_dependencies() -> set[str]:
    """The client's dependencies that the Lambda layer does not install (httpx2, websockets, tqdm)."""
    client = _names(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    layer = _names((REPO_ROOT / "lambdas" / "requirements.txt").read_text().splitlines())
    return client - layer


def test_the_lambda_source_asset_runs_the_core_from_what_it_holds(tmp_path: Path):
    # GIVEN the source asset staged as the stack stages it (its default packages)
    packages = inspect.signature(LambdaCode.__init__).parameters["packages"].default
    staged = _stage_sources(REPO_ROOT, packages, tmp_path)
    # WHEN the core is imported from the asset alone, the layer's dependencies from this venv, and the client's own
    # (which the layer does not install) made unimportable
    blocked = sorted(client_only_dependencies())
    assert "httpx2" in blocked, blocked
    script = f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); import {CORE_MODULES}"
    env = {**os.environ, "PYTHONPATH": str(staged)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    # THEN it imports: the client package the schemas come from is in the asset, and its models need pydantic only
    assert done.returncode == 0, done.stderr
    assert (staged / "async_inference_client" / "models" / "jobs.py").is_file()
