"""Fixtures of the fault-injection tests: one stack of their own for the session (see ``fault_stack``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.fault_stack import FaultStack, Subscriber


@pytest.fixture(scope="session")
def fstack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[FaultStack]:
    stack = FaultStack(tmp_path_factory.mktemp("fault-logs"), local_assembly).start()
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def subscriber(fstack: FaultStack) -> Subscriber:
    return Subscriber(fstack)


@pytest.fixture
def workers(fstack: FaultStack) -> Iterator[FaultStack]:
    """The stack, with every worker a test started stopped at its end and the queue left empty."""
    started = len(fstack.workers)
    yield fstack
    for process in fstack.workers[started:]:
        if process.poll() is None:
            process.kill()
            process.wait()
    fstack.empty_queue()
