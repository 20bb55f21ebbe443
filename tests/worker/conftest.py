"""Fixtures of the worker tests: a local stack of their own, out of process (``tests.faults.fault_stack``).

The end-to-end suite's stack lives in the test process (its Lambda handlers are imported there, bound to its moto
server), so a second one in the same session would answer with the first one's handlers: these tests start the same
stack as a subprocess instead, and run their workers against it.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from async_inference.client import Client
from tests.faults.fault_stack import FaultStack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    local = FaultStack(tmp_path_factory.mktemp("worker-stack-logs")).start()
    yield local
    local.stop()


@pytest.fixture(scope="session")
def api(stack: FaultStack) -> Client:
    return stack.api()
