"""``pip install .`` in a fresh venv gives the ``async-inference`` command and the SDK, with the client's dependencies
only: no boto3, no pydantic-settings, no module of the service.

The venv is kept under .venv-sdk-test/<hash of pyproject.toml> (git-ignored), so only a change to the package's
metadata pays for a fresh install; the package itself is reinstalled from this checkout on every run. CI starts
clean, so there every run is the fresh install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.fake_api import JOB_ID, FakeApi, Reply, job_view

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = REPO_ROOT / "pyproject.toml"
CACHE = REPO_ROOT / ".venv-sdk-test"


def _pip(venv: Path, *args: str) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _source(tmp: Path) -> Path:
    """What ``pip install .`` reads: the project file and the package (a copy, so no build files land in the repo)."""
    source = tmp / "source"
    source.mkdir()
    shutil.copy(PYPROJECT, source / "pyproject.toml")
    # The whole tree a checkout has, so that the package list in pyproject.toml, not this copy, decides what ships.
    for folder in ("async_inference_client", "async_inference", "lambdas", "gpu_worker", "cdk"):
        shutil.copytree(REPO_ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return source


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = hashlib.sha256(PYPROJECT.read_bytes()).hexdigest()[:16]
    venv = CACHE / key
    for stale in CACHE.glob("*"):
        if stale != venv:
            shutil.rmtree(stale, ignore_errors=True)
    source = _source(tmp_path_factory.mktemp("sdk"))
    if (venv / ".complete").exists():
        _pip(venv, "--no-deps", "--force-reinstall", str(source))
    else:
        shutil.rmtree(venv, ignore_errors=True)
        # From the project's .venv this still makes a bare venv on the base interpreter, with nothing installed.
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        _pip(venv, str(source))
        (venv / ".complete").touch()
    return venv


def run(venv: Path, *command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command of the venv, from outside the repository and without PYTHONPATH: only what pip installed counts."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("ASYNC_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return subprocess.run(list(command), env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_installed_command_prints_its_help(venv: Path, tmp_path: Path):
    done = run(venv, "async-inference", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "submit" in done.stdout and "130  interrupted" in done.stdout


def test_the_sdk_imports_with_the_client_dependencies_only(venv: Path, tmp_path: Path):
    script = (
        "import importlib.util, sys\n"
        "from async_inference_client import AsyncClient, Client\n"
        "from async_inference_client.models.jobs import JobView\n"
        "print(*[importlib.util.find_spec(m) is None for m in ('boto3', 'botocore', 'pydantic_settings')])\n"
    )
    done = run(venv, "python", "-c", script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"], "neither boto3 nor pydantic-settings is installed"


def test_the_install_pulls_only_the_client_dependencies(venv: Path, tmp_path: Path):
    # WHEN the fresh venv lists what pip installed into it
    done = run(venv, "python", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    installed = {line.split("==")[0].lower().replace("_", "-") for line in done.stdout.split()}
    # THEN the client and what it needs are there, and nothing of AWS or of the service's settings
    assert {"async-inference-client", "pydantic", "httpx2", "websockets", "tqdm"} <= installed
    assert installed & {"boto3", "botocore", "pydantic-settings", "aws-lambda-powertools", "aws-cdk-lib"} == set()


def test_the_wheel_holds_the_client_package_only(venv: Path, tmp_path: Path):
    # WHEN the installed distribution's files are listed
    script = (
        "import importlib.metadata as m, importlib.util as u\n"
        "print(*sorted({f.parts[0] for f in m.files('async-inference-client') if f.suffix == '.py'}))\n"
        "print(*[u.find_spec(p) is None for p in ('async_inference', 'lambdas', 'gpu_worker', 'cdk')])\n"
    )
    done = run(venv, "python", "-c", script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    packages, absent = done.stdout.splitlines()
    # THEN every module it installed is the client's, and no package of the service is importable
    assert packages.split() == ["async_inference_client"]
    assert absent.split() == ["True"] * 4


def test_the_installed_command_talks_to_an_api(venv: Path, tmp_path: Path):
    with FakeApi(lambda seen: Reply(200, job_view("running", model="m"))) as api:
        done = run(
            venv,
            "async-inference",
            "--api-url",
            api.url,
            "--api-key",
            "k-0123456789abcdefghij",
            "status",
            JOB_ID,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr
    assert "status    running" in done.stdout.splitlines()


def test_the_installed_command_has_no_operator_commands(venv: Path, tmp_path: Path):
    # The AWS-side commands (DLQ, signing secrets) are the service's: `python -m async_inference.cli` in a checkout.
    done = run(venv, "async-inference", "dlq", "list", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "invalid choice: 'dlq'" in done.stderr
