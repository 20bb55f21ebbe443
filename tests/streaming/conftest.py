"""A moto server with the job event log table, and a session-wide event loop for the engines (they bind to one)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from async_inference.aws import client
from async_inference.streaming import EventLog
from async_inference.streaming import log as log_layout
from local_runtime.moto_server import LOCAL_CREDENTIALS, MotoServer, free_port

T = TypeVar("T")


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer(free_port()).start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in LOCAL_CREDENTIALS.items():
            patch.setenv(name, value)
        patch.setenv("AWS_ENDPOINT_URL", server.url)
        yield server
    server.stop()


@pytest.fixture(scope="module")
def event_log(moto: MotoServer) -> EventLog:
    """The log table, keyed as cdk/job_streams.py declares it (the stack's template is checked in tests/cdk)."""
    dynamodb = client("dynamodb")
    dynamodb.create_table(
        TableName="job-streams",
        KeySchema=[
            {"AttributeName": log_layout.PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": log_layout.SORT_KEY, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": log_layout.PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": log_layout.SORT_KEY, "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return EventLog("job-streams", dynamodb)


@pytest.fixture(scope="module")
def run() -> Iterator[Callable[[Coroutine[Any, Any, T]], T]]:
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()
