"""A revoked key's WebSocket connections are closed, not told: against a real moto server over HTTP (the connection
table as the template declares it), with the key lookup both APIs use and API Gateway's management API recorded."""

from __future__ import annotations

from typing import Any

import pytest

from async_inference import settings
from async_inference.authorizer import KEYS_TTL_S, TenantKeys
from async_inference.aws import ConnectionPoster, ConnectionStore, TooManyConnections, client
from async_inference.push import Pushed, Pusher, WebSocketRoutes
from async_inference.schemas import JobEvent, Subscription
from local_runtime.moto_server import MotoServer

TABLE = "security-connections"


class Management:
    """API Gateway's management API for the stage: what was posted to and which connections were closed."""

    def __init__(self) -> None:
        self.posted: list[str] = []
        self.deleted: list[str] = []

    def post_to_connection(self, ConnectionId: str, Data: bytes) -> None:  # noqa: N803 - boto3's names
        self.posted.append(ConnectionId)

    def delete_connection(self, ConnectionId: str) -> None:  # noqa: N803
        self.deleted.append(ConnectionId)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Keys(dict):
    def __call__(self) -> Any:
        return dict(self)


@pytest.fixture(scope="module")
def connections(moto: MotoServer) -> ConnectionStore:
    string = "S"
    client("dynamodb").create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": settings.CONNECTION_TABLE_PARTITION_KEY, "AttributeType": string},
            {"AttributeName": settings.CONNECTION_TENANT_KEY, "AttributeType": string},
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
    return ConnectionStore(TABLE)


def test_a_connection_whose_key_is_revoked_is_closed_at_its_tenants_next_event(connections):
    # GIVEN a tenant rotating keys, with one connection opened with each, both following all its jobs
    clock, keys = Clock(), Keys({"id-old": ("old-key", True), "id-new": ("new-key", True)})
    tenants = TenantKeys({"acme": ["id-old", "id-new"]}, keys, clock=clock)
    routes = WebSocketRoutes(connections, tenants)
    assert routes.connect("conn-old", {"x-api-key": "old-key"}, None) == "acme"
    assert routes.connect("conn-new", None, {settings.WS_API_KEY_QUERY_PARAMETER: "new-key"}) == "acme"
    for connection in ("conn-old", "conn-new"):
        connections.subscribe(connection, Subscription(action="subscribe", all=True))
    management = Management()
    pusher = Pusher(connections, ConnectionPoster("http://unused", management=management), tenants)
    event = Pushed("acme", JobEvent(type="job.started", job_id="job_" + "0" * 32))
    assert pusher.push(event).sent == 2
    # WHEN the old key is disabled, and the next event comes once the lookup has refreshed (30 s at most)
    keys["id-old"] = ("old-key", False)
    clock.now = KEYS_TTL_S
    management.posted.clear()
    outcome = pusher.push(event)
    # THEN the old key's connection is closed and forgotten, told nothing; the new key's is told
    assert (outcome.sent, outcome.revoked) == (1, 1)
    assert management.posted == ["conn-new"] and management.deleted == ["conn-old"]
    assert connections.subscribers("acme") == ["conn-new"]
    # AND the connection table holds a hash of each key, never the key
    items = client("dynamodb").scan(TableName=TABLE)["Items"]
    assert "old-key" not in str(items) and "new-key" not in str(items) and all("key_hash" in i for i in items)


def test_a_tenant_at_its_connection_limit_is_refused_and_another_tenant_is_not(connections):
    # GIVEN a tenant with 3 open connections, its limit here (settings.WS_MAX_CONNECTIONS_PER_TENANT in the stack)
    for index in range(3):
        connections.open(f"limited-{index}", "limited", max_per_tenant=3)
    # WHEN it opens a fourth THEN it is refused, naming the limit; another tenant still connects
    with pytest.raises(TooManyConnections, match="3 open WebSocket connections"):
        connections.open("limited-3", "limited", max_per_tenant=3)
    connections.open("other-0", "other", max_per_tenant=3)
    # AND once one closes, it may open one again
    connections.close("limited-0")
    connections.open("limited-3", "limited", max_per_tenant=3)
    assert connections.count("limited", up_to=10) == 3
