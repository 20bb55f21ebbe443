"""A fresh moto server for a local-runtime test (no process-wide client settings: the tests build their clients)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_runtime.moto_server import MotoServer, free_port


@pytest.fixture
def moto() -> Iterator[MotoServer]:
    server = MotoServer(free_port()).start()
    yield server
    server.stop()
