"""The delta push: the job event log's items, as the table's stream hands them over, posted as ``job.delta`` messages
to the connections that follow the job, against a real moto server (the connection table as the template declares
it) with API Gateway's management API recorded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from async_inference import settings
from async_inference.aws import ConnectionPoster, ConnectionStore, client
from async_inference.push import Pusher, delta_of
from async_inference.schemas import Subscription
from async_inference.streaming.log import Delta, End, Segment
from local_runtime.moto_server import MotoServer

TABLE = "delta-connections"
JOB = "job_" + "d" * 32


class Management:
    """The stage's management API: each connection's messages, in the order posted."""

    def __init__(self) -> None:
        self.posted: dict[str, list[dict[str, Any]]] = {}

    def post_to_connection(self, ConnectionId: str, Data: bytes) -> None:  # noqa: N803 - boto3's names
        self.posted.setdefault(ConnectionId, []).append(json.loads(Data))


class CountingStore(ConnectionStore):
    followers_read = 0

    def followers(self, tenant: str, **scope: Any) -> list[tuple[str, str | None]]:
        self.followers_read += 1
        return super().followers(tenant, **scope)


@pytest.fixture(scope="module")
def connections(moto: MotoServer) -> CountingStore:
    client("dynamodb").create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": settings.CONNECTION_TABLE_PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": settings.CONNECTION_TENANT_KEY, "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": settings.CONNECTION_TABLE_PARTITION_KEY, "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": settings.CONNECTION_TENANT_INDEX_NAME,
                "KeySchema": [{"AttributeName": settings.CONNECTION_TENANT_KEY, "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )
    store = CountingStore(TABLE)
    for connection, tenant, scope in (
        ("by-id", "acme", {"job_ids": [JOB]}),
        ("all-of-acme", "acme", {"all": True}),
        ("all-of-other", "other", {"all": True}),
    ):
        store.open(connection, tenant)
        store.subscribe(connection, Subscription.model_validate(scope))
    return store


def image(segment: Segment, tenant: str | None = "acme") -> dict[str, Any]:
    """The item as the worker writes it, deserialized as the stream record's new image is."""
    item = segment.to_item(JOB, tenant=tenant)
    return {name: next(iter(value.values())) for name, value in item.items()}


def test_a_segment_becomes_a_job_delta_with_its_seq_text_and_tokens():
    # GIVEN a segment as the log holds it WHEN it is read from the stream's new image
    pushed = delta_of(image(Segment(seq=1_000_002, deltas=[Delta(text="Hello")], completion_tokens=2)))
    # THEN it is a job.delta of the job's tenant, the segment's fields as they are
    assert pushed is not None and pushed.tenant == "acme"
    assert json.loads(pushed.event.model_dump_json(exclude_none=True)) == {
        "type": "job.delta",
        "job_id": JOB,
        "seq": 1_000_002,
        "deltas": [{"index": 0, "text": "Hello"}],
        "completion_tokens": 2,
    }


def test_a_segment_without_its_tenant_is_told_to_nobody():
    assert delta_of(image(Segment(seq=1, deltas=[Delta(text="x")]), tenant=None)) is None


def test_a_jobs_segments_reach_its_tenants_followers_in_order_and_the_followers_are_read_once(connections):
    # GIVEN three segments of one job in one stream batch, the last with the run's end
    segments = [
        Segment(seq=1_000_001, deltas=[Delta(text="one ")]),
        Segment(seq=1_000_002, deltas=[Delta(text="two")]),
        Segment(seq=1_000_003, end=End(status="succeeded")),
    ]
    pushed = [delta_of(image(segment)) for segment in segments]
    management = Management()
    pusher = Pusher(connections, ConnectionPoster("http://unused", management=management))
    before = connections.followers_read
    # WHEN they are pushed
    outcome = pusher.push_all([p for p in pushed if p is not None])
    # THEN each connection of the job's tenant that follows it got the three, in the log's order, and the other
    # tenant's connection none; the job's followers were read once for the three
    assert {c: [m["seq"] for m in posted] for c, posted in management.posted.items()} == {
        "by-id": [1_000_001, 1_000_002, 1_000_003],
        "all-of-acme": [1_000_001, 1_000_002, 1_000_003],
    }
    assert outcome.sent == 6 and connections.followers_read - before == 1
