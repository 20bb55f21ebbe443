"""Fixtures of the worker tests: a local stack of the template of their own (``tests.faults.fault_stack``), with no
workers: each test starts the workers it needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from async_inference_client import Client
from tests.faults.fault_stack import FaultStack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[FaultStack]:
    local = FaultStack(tmp_path_factory.mktemp("worker-stack-logs"), local_assembly).start()
    yield local
    local.stop()


@pytest.fixture(scope="session")
def api(stack: FaultStack) -> Client:
    return stack.api()
