"""Fixtures of the client's tests: the CLI as a person runs it (a subprocess), and a local stack for it to talk to."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.fault_stack import REPO_ROOT, FaultStack

CliRun = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m async_inference_client.cli ARGS`` with none of the ASYNC_INFERENCE_* variables but those in ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ASYNC_INFERENCE_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "async_inference_client.cli", *args],
        env={**base, **(env or {})},
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="session")
def cli_stack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[FaultStack]:
    """A local stack of the template (echo engine, no workers) for the CLI to talk to."""
    stack = FaultStack(tmp_path_factory.mktemp("cli-stack"), local_assembly).start()
    yield stack
    stack.stop()


@pytest.fixture
def on_stack(cli_stack: FaultStack) -> CliRun:
    """The CLI pointed at the stack by its environment variables, as the README says to."""
    from tests.faults.fault_stack import API_KEY

    env = {"ASYNC_INFERENCE_API_URL": cli_stack.api_url, "ASYNC_INFERENCE_API_KEY": API_KEY}
    return lambda *args, **kwargs: run_cli(*args, env=env, **kwargs)
