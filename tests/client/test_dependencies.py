"""The SDK's dependencies are declared once for `pip install .` (pyproject.toml) and repeated for `make venv`
(requirements.txt): the two must agree. And importing the client pulls in neither boto3 nor the service."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_every_sdk_dependency_is_in_requirements_txt_with_the_same_bounds():
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = {line.split("#")[0].strip() for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()}
    assert [d for d in declared if d not in required] == []


def test_importing_the_client_imports_neither_boto3_nor_the_service():
    # In the project's own venv, where boto3 is installed: the client must still not load it.
    script = ("import sys, async_inference.client, async_inference.cli\n"
              "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'lambdas')\n"
              "      or m in ('async_inference.aws', 'async_inference.service', 'async_inference.webhooks'))))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
