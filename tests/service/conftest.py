"""A moto server for each module of the service tests, with this process's boto3 clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_runtime.moto_server import LOCAL_CREDENTIALS, MotoServer, free_port


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer(free_port()).start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in LOCAL_CREDENTIALS.items():
            patch.setenv(name, value)
        patch.setenv("AWS_ENDPOINT_URL", server.url)
        yield server
    server.stop()
