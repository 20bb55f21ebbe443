"""Shared fixtures for the engine tests.

The engines are asyncio objects bound to one event loop, and the CPU engine loads a real model once per session, so
the tests run coroutines on a session-wide loop (``run``) rather than one loop per test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


@pytest.fixture(scope="session")
def event_loop_session() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def run(event_loop_session: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, T]], T]:
    """Run a coroutine to completion on the session's loop."""
    return event_loop_session.run_until_complete
