"""The WebSocket API: its connection table (``ConnectionStore``: who is connected and what each follows, with the
limits ``TooManyConnections`` and ``TooManySubscriptions``) and its management API (``ConnectionPoster``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import boto3
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.aws.clients import BOTO_CONFIG, is_error
from async_inference.schemas import Subscription, utcnow


class TooManyConnections(Exception):
    """A $connect would take its tenant past settings.WS_MAX_CONNECTIONS_PER_TENANT open connections."""


class TooManySubscriptions(Exception):
    """A subscribe message would take the connection past settings.WS_MAX_JOB_IDS_PER_CONNECTION job ids."""


_CONNECTION = settings.CONNECTION_TABLE_PARTITION_KEY
_KEY_HASH = "key_hash"  # async_inference.authorizer.key_hash of the key a connection opened with


class ConnectionStore:
    """The WebSocket API's connection table: one item per open connection, its tenant and what it subscribed to
    (``job_ids`` and ``batch_ids`` string sets, ``all``), listed per tenant through the tenant index."""

    def __init__(self, table_name: str, dynamodb: Any | None = None) -> None:
        self._table = (dynamodb or boto3.resource("dynamodb", config=BOTO_CONFIG)).Table(table_name)

    def open(
        self,
        connection_id: str,
        tenant: str,
        key_hash: str | None = None,
        *,
        max_per_tenant: int = settings.WS_MAX_CONNECTIONS_PER_TENANT,
    ) -> None:
        """Record an open connection of ``tenant``, and the hash of the key it opened with (the push drops a connection
        whose key is revoked). TooManyConnections when the tenant has ``max_per_tenant`` open already (counted on the
        eventually consistent tenant index: connects racing within its lag may each pass)."""
        if self.count(tenant, up_to=max_per_tenant) >= max_per_tenant:
            raise TooManyConnections(
                f"tenant {tenant} has {max_per_tenant} open WebSocket connections, the most it may"
            )
        now = utcnow()
        self._table.put_item(
            Item={
                _CONNECTION: connection_id,
                settings.CONNECTION_TENANT_KEY: tenant,
                "connected_at": now.isoformat(),
                settings.CONNECTION_TTL_ATTRIBUTE: int(now.timestamp()) + settings.WS_MAX_CONNECTION_S,
                **({_KEY_HASH: key_hash} if key_hash else {}),
            }
        )

    def close(self, connection_id: str) -> None:
        self._table.delete_item(Key={_CONNECTION: connection_id})

    def tenant_of(self, connection_id: str) -> str | None:
        """The tenant an open connection belongs to; None when it is not open (any more)."""
        item = self._table.get_item(
            Key={_CONNECTION: connection_id},
            ProjectionExpression="#tenant",
            ExpressionAttributeNames={"#tenant": settings.CONNECTION_TENANT_KEY},
        ).get("Item")
        return str(item[settings.CONNECTION_TENANT_KEY]) if item else None

    def count(self, tenant: str, *, up_to: int) -> int:
        """The tenant's open connections (expired ones not yet deleted by TTL left out), counted up to ``up_to``."""
        kwargs: dict[str, Any] = {
            "IndexName": settings.CONNECTION_TENANT_INDEX_NAME,
            "Select": "COUNT",
            "KeyConditionExpression": Key(settings.CONNECTION_TENANT_KEY).eq(tenant),
            "FilterExpression": Attr(settings.CONNECTION_TTL_ATTRIBUTE).gt(int(utcnow().timestamp())),
        }
        count = 0
        while count < up_to:
            response = self._table.query(**kwargs)
            count += response["Count"]
            if not response.get("LastEvaluatedKey"):
                break
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return count

    def subscribe(self, connection_id: str, subscription: Subscription) -> bool:
        """Add the subscription's scope to the connection's; False when the connection is not (any more) open.
        Raises TooManySubscriptions past the per-connection limit of job ids."""
        names = {"#pk": _CONNECTION}
        values: dict[str, Any] = {}
        condition = "attribute_exists(#pk)"
        if subscription.job_ids:
            ids = set(subscription.job_ids)
            update = "ADD #job_ids :ids"
            names["#job_ids"] = "job_ids"
            values[":ids"] = ids
            values[":room"] = settings.WS_MAX_JOB_IDS_PER_CONNECTION - len(ids)
            condition += " AND (attribute_not_exists(#job_ids) OR size(#job_ids) <= :room)"
        elif subscription.batch_id:
            update = "ADD #batch_ids :batch"
            names["#batch_ids"] = "batch_ids"
            values[":batch"] = {subscription.batch_id}
        else:
            update = "SET #all = :true"
            names["#all"] = "all"
            values[":true"] = True
        request = {"Key": {_CONNECTION: connection_id}, "UpdateExpression": update, "ExpressionAttributeNames": names}
        try:
            self._table.update_item(**request, ConditionExpression=condition, ExpressionAttributeValues=values)
        except ClientError as exc:
            if not is_error(exc, "ConditionalCheckFailedException"):
                raise
            item = self._table.get_item(Key={_CONNECTION: connection_id}).get("Item")
            if item is None:
                return False
            # Near the limit, the size check above counts ids the connection follows already: count them once.
            ids = set(item.get("job_ids") or ()) | set(subscription.job_ids or ())
            if len(ids) > settings.WS_MAX_JOB_IDS_PER_CONNECTION:
                raise TooManySubscriptions(
                    f"a connection follows at most {settings.WS_MAX_JOB_IDS_PER_CONNECTION} job ids: subscribe with "
                    "'all': true instead, or open another connection"
                ) from exc
            values.pop(":room", None)
            self._table.update_item(
                **request, ConditionExpression="attribute_exists(#pk)", ExpressionAttributeValues=values
            )
        return True

    def followed(self, tenant: str, job_ids: Iterable[str]) -> set[str]:
        """Which of the tenant's ``job_ids`` some open connection follows (by id, or all of the tenant's work): one
        Query of the tenant index, so that a worker publishes progress events only for those."""
        wanted = set(job_ids)
        kwargs: dict[str, Any] = {
            "IndexName": settings.CONNECTION_TENANT_INDEX_NAME,
            "KeyConditionExpression": Key(settings.CONNECTION_TENANT_KEY).eq(tenant),
            "FilterExpression": Attr(settings.CONNECTION_TTL_ATTRIBUTE).gt(int(utcnow().timestamp())),
            "ProjectionExpression": "#all, job_ids",
            "ExpressionAttributeNames": {"#all": "all"},
        }
        found: set[str] = set()
        while True:
            response = self._table.query(**kwargs)
            for item in response.get("Items", []):
                if item.get("all"):
                    return wanted
                found |= wanted & set(item.get("job_ids") or ())
            if not response.get("LastEvaluatedKey"):
                return found
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def subscribers(self, tenant: str, *, job_id: str | None = None, batch_id: str | None = None) -> list[str]:
        """Ids of the tenant's open connections subscribed to the job or the batch (by id, or to all of the tenant's
        work). Only this tenant's connections are read: another tenant's never see its jobs."""
        return [connection for connection, _ in self.followers(tenant, job_id=job_id, batch_id=batch_id)]

    def followers(
        self, tenant: str, *, job_id: str | None = None, batch_id: str | None = None
    ) -> list[tuple[str, str | None]]:
        """``subscribers``, each with the hash of the key its connection opened with (None: opened before keys were
        recorded)."""
        wanted = Attr("all").eq(True)
        if job_id:
            wanted = wanted | Attr("job_ids").contains(job_id)
        if batch_id:
            wanted = wanted | Attr("batch_ids").contains(batch_id)
        kwargs: dict[str, Any] = {
            "IndexName": settings.CONNECTION_TENANT_INDEX_NAME,
            "KeyConditionExpression": Key(settings.CONNECTION_TENANT_KEY).eq(tenant),
            # DynamoDB's TTL deletes an item some time after it expires: until then, it is ignored here.
            "FilterExpression": Attr(settings.CONNECTION_TTL_ATTRIBUTE).gt(int(utcnow().timestamp())) & wanted,
            "ProjectionExpression": "#pk, #key",
            "ExpressionAttributeNames": {"#pk": _CONNECTION, "#key": _KEY_HASH},
        }
        found: list[tuple[str, str | None]] = []
        while True:
            response = self._table.query(**kwargs)
            found.extend((item[_CONNECTION], item.get(_KEY_HASH)) for item in response.get("Items", []))
            if not response.get("LastEvaluatedKey"):
                return found
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]


class ConnectionPoster:
    """Sends messages to WebSocket connections through the stage's management API (``POST @connections/{id}``)."""

    def __init__(self, endpoint_url: str, management: Any | None = None) -> None:
        # The management API lives at the stage's own URL: an explicit endpoint, which wins over AWS_ENDPOINT_URL.
        self._management = management or boto3.client(
            "apigatewaymanagementapi", endpoint_url=endpoint_url, config=BOTO_CONFIG
        )

    def post(self, connection_id: str, data: bytes) -> bool:
        """Send ``data``; False when the connection is gone (closed by the client or by API Gateway)."""
        try:
            self._management.post_to_connection(ConnectionId=connection_id, Data=data)
        except ClientError as exc:
            if is_error(exc, "GoneException"):
                return False
            raise
        return True

    def disconnect(self, connection_id: str) -> None:
        """Close the connection (``DELETE @connections/{id}``); one already gone is fine."""
        try:
            self._management.delete_connection(ConnectionId=connection_id)
        except ClientError as exc:
            if not is_error(exc, "GoneException"):
                raise
