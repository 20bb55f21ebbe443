"""The batch table's adapter: the only code that reads or writes files' and batches' records.

Every batch state write is conditional on the states it may leave (``models.BATCH_SOURCES``). The worker calls two
methods, ``statuses`` and ``record_chunk`` (docs/design/batches.md); the API and the controller the rest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import boto3
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.aws import BOTO_CONFIG, append_webhook_attempt, is_error, put_new
from async_inference.batches.models import (
    BATCH_SOURCES,
    FINAL_BATCH_STATES,
    BatchRecord,
    BatchStatus,
    ChunkRange,
    FileRecord,
    epoch,
)
from async_inference.schemas import utcnow

_PK = settings.BATCH_TABLE_PARTITION_KEY
_OWNER = settings.BATCH_OWNER_ATTRIBUTE
_SORT = settings.BATCH_CREATED_KEY_ATTRIBUTE
_TTL = settings.BATCH_TTL_ATTRIBUTE
_ACTIVE = settings.BATCH_ACTIVE_ATTRIBUTE
Kind = Literal["file", "batch"]
BATCH_GET_LIMIT = 100  # DynamoDB BatchGetItem's keys per request


@dataclass(frozen=True)
class ChunkRecorded:
    """What ``record_chunk`` did: whether this call counted the chunk (False: it was counted before), and whether
    every chunk of the batch is counted now (then the caller sends ``BatchControl(kind="finalize")``)."""

    counted: bool
    all_counted: bool


class InvalidCursor(ValueError):
    """An ``after`` that is not an object of this tenant and kind."""


def owner_of(tenant: str, kind: Kind) -> str:
    return f"{tenant}#{kind}"


def _plain(value: Any) -> Any:
    """DynamoDB's Decimals (and sets of them) back into ints."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, set)):
        converted = [_plain(v) for v in value]
        return set(converted) if isinstance(value, set) else converted
    return value


def _item(record: FileRecord | BatchRecord) -> dict[str, Any]:
    item = {
        k: v
        for k, v in record.model_dump(mode="json", exclude={"counted_chunks"}).items()
        if v is not None and v != [] and v != {}
    }
    item[_OWNER] = owner_of(record.tenant, record.kind)
    # Newest first down to the microsecond (objects created in the same second keep their order); the id breaks ties.
    item[_SORT] = f"{record.created_at.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%S.%f}#{record.id}"
    item[_TTL] = epoch(record.created_at) + settings.FILE_RETENTION_DAYS * 86400
    if isinstance(record, BatchRecord) and record.status not in FINAL_BATCH_STATES:
        item[_ACTIVE] = record.tenant  # in the index of batches in flight until the write that makes it final
    return item


def _value(value: Any) -> Any:
    if isinstance(value, BatchStatus):
        return value.value
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_value(v) for v in value]
    if hasattr(value, "model_dump"):
        return {k: v for k, v in value.model_dump(mode="json").items() if v is not None}
    return value


class BatchStore:
    """Files and batches in the batch table (``settings.BATCH_*`` names its keys and index)."""

    def __init__(self, table_name: str, dynamodb: Any | None = None) -> None:
        self._dynamodb = dynamodb or boto3.resource("dynamodb", config=BOTO_CONFIG)
        self._table = self._dynamodb.Table(table_name)

    # --- the worker's two calls -----------------------------------------------------------------------------------

    def statuses(self, batch_ids: Iterable[str]) -> dict[str, BatchStatus]:
        """Current status of up to 100 batches in one request (the worker's heartbeat: cancelling/cancelled/
        expired batches have their running lines aborted, their queued chunks skipped). Unknown ids are absent."""
        ids = list(dict.fromkeys(batch_ids))
        if len(ids) > BATCH_GET_LIMIT:
            raise ValueError(f"at most {BATCH_GET_LIMIT} batch ids at once, got {len(ids)}")
        found: dict[str, BatchStatus] = {}
        if not ids:
            return found
        request: dict[str, Any] = {
            self._table.name: {
                "Keys": [{_PK: i} for i in ids],
                "ConsistentRead": True,
                "ProjectionExpression": "#id, #status",
                "ExpressionAttributeNames": {"#id": _PK, "#status": "status"},
            }
        }
        while request:
            response = self._dynamodb.batch_get_item(RequestItems=request)
            for item in response.get("Responses", {}).get(self._table.name, []):
                if str(item[_PK]).startswith("batch_"):
                    found[item[_PK]] = BatchStatus(item["status"])
            request = response.get("UnprocessedKeys") or {}
        return found

    def record_chunk(self, batch_id: str, chunk: int, *, completed: int, failed: int) -> ChunkRecorded:
        """Count one chunk's lines, once: a conditional UpdateItem that adds the counts only if ``chunk`` was not
        counted before (a redelivered chunk counts nothing twice). ChunkRecorded says whether this call counted it and
        whether every chunk of the batch is now counted (then the caller sends BatchControl(kind="finalize"))."""
        try:
            response = self._table.update_item(
                Key={_PK: batch_id},
                UpdateExpression="ADD #completed :completed, #failed :failed, #counted :chunk SET #updated = :now",
                ConditionExpression="attribute_exists(#id) AND (attribute_not_exists(#counted) OR NOT contains(#counted, :n))",
                ExpressionAttributeNames={
                    "#id": _PK,
                    "#completed": "completed",
                    "#failed": "failed",
                    "#counted": "counted_chunks",
                    "#updated": "updated_at",
                },
                ExpressionAttributeValues={
                    ":completed": completed,
                    ":failed": failed,
                    ":chunk": {chunk},
                    ":n": chunk,
                    ":now": utcnow().isoformat(),
                },
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if not is_error(exc, "ConditionalCheckFailedException"):
                raise
            record = self.get_batch(batch_id)
            return ChunkRecorded(counted=False, all_counted=bool(record and record.all_counted))
        return ChunkRecorded(counted=True, all_counted=self._batch(response["Attributes"]).all_counted)

    # --- files ----------------------------------------------------------------------------------------------------

    def create(self, record: FileRecord | BatchRecord) -> bool:
        """Store a new file or batch; False when one with its id exists (a finalize that runs again)."""
        return put_new(self._table, _item(record), _PK)

    def get_file(self, file_id: str) -> FileRecord | None:
        item = self._get(file_id)
        return FileRecord.model_validate(_plain(item)) if item and item.get("kind") == "file" else None

    def confirm_upload(self, file_id: str) -> FileRecord | None:
        """A presigned upload's bytes have arrived: the file is no longer awaiting them."""
        try:
            response = self._table.update_item(
                Key={_PK: file_id},
                UpdateExpression="REMOVE #pending",
                ConditionExpression="attribute_exists(#id)",
                ExpressionAttributeNames={"#pending": "upload_expires_at", "#id": _PK},
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if is_error(exc, "ConditionalCheckFailedException"):
                return None
            raise
        return FileRecord.model_validate(_plain(response["Attributes"]))

    def delete(self, object_id: str) -> None:
        self._table.delete_item(Key={_PK: object_id})

    # --- batches --------------------------------------------------------------------------------------------------

    def get_batch(self, batch_id: str) -> BatchRecord | None:
        item = self._get(batch_id)
        return self._batch(item) if item and item.get("kind") == "batch" else None

    def transition(
        self, batch_id: str, target: BatchStatus, *, only_from: Iterable[BatchStatus] | None = None, **fields: Any
    ) -> BatchRecord | None:
        """Move a batch to ``target`` if its current state allows it, setting ``fields``; the new record, or None when
        the move was not allowed. ``<target>_at`` is set to now unless it is set already (a repeated finalizing)."""
        now = utcnow().isoformat()
        sources = BATCH_SOURCES[target] if only_from is None else BATCH_SOURCES[target] & frozenset(only_from)
        values: dict[str, Any] = {
            "status": target.value,
            "updated_at": now,
            **{k: _value(v) for k, v in fields.items()},
        }
        if target in FINAL_BATCH_STATES:
            values["notified"] = False
        names = {f"#{k}": k for k in values}
        expr_values = {f":{k}": v for k, v in values.items()}
        sets = [f"#{k} = :{k}" for k in values]
        stamp = f"{target.value}_at"
        names["#stamp"], expr_values[":stamp"] = stamp, now
        sets.append("#stamp = if_not_exists(#stamp, :stamp)")
        update = "SET " + ", ".join(sets)
        if target in FINAL_BATCH_STATES:
            # Out of the index of batches in flight in the same write: no count of lines in flight can drift.
            names["#active"] = _ACTIVE
            update += " REMOVE #active"
        try:
            response = self._table.update_item(
                Key={_PK: batch_id},
                UpdateExpression=update,
                ConditionExpression=Attr("status").is_in([s.value for s in sources]),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=expr_values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if is_error(exc, "ConditionalCheckFailedException"):
                return None
            raise
        return self._batch(response["Attributes"])

    def record_plan(
        self, batch_id: str, *, total: int, model: str | None, chunks: list[ChunkRange]
    ) -> BatchRecord | None:
        """Record a validated input's line count, model and chunks, once, while the batch is still validating; the
        batch as it stands, or None when it left ``validating`` (cancelled meanwhile)."""
        values: dict[str, Any] = {
            ":total": total,
            ":count": len(chunks),
            ":validating": BatchStatus.VALIDATING.value,
            ":chunks": [c.model_dump() for c in chunks],
        }
        update = "SET #total = :total, #count = :count, #chunks = :chunks"
        names = {"#total": "total", "#count": "chunk_count", "#chunks": "chunks", "#status": "status"}
        if model is not None:
            update += ", #model = :model"
            names["#model"], values[":model"] = "model", model
        try:
            response = self._table.update_item(
                Key={_PK: batch_id},
                UpdateExpression=update,
                ConditionExpression="#status = :validating AND attribute_not_exists(#count)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if not is_error(exc, "ConditionalCheckFailedException"):
                raise
            record = self.get_batch(batch_id)
            return record if record is not None and record.status is BatchStatus.VALIDATING else None
        return self._batch(response["Attributes"])

    def record_webhook_attempt(self, batch_id: str, attempt: dict[str, Any], *, status: str | None = None) -> bool:
        """Append one delivery attempt to the batch's webhook (and set its status); False when the batch or its
        webhook is gone (``JobStore.record_webhook_attempt``'s contract, which the webhook dispatcher calls)."""
        return append_webhook_attempt(self._table, {_PK: batch_id}, attempt, status=status)

    def mark_notified(self, batch_id: str) -> None:
        self._table.update_item(
            Key={_PK: batch_id},
            UpdateExpression="SET #notified = :true",
            ConditionExpression="attribute_exists(#id)",
            ExpressionAttributeNames={"#notified": "notified", "#id": _PK},
            ExpressionAttributeValues={":true": True},
        )

    # --- quotas (async_inference.quotas) ---------------------------------------------------------------------------

    def lines_in_flight(self, tenant: str, *, up_to: int) -> int:
        """The lines of the tenant's batches not yet final (a batch not yet planned counts none), added up until they
        reach ``up_to``; read from the sparse index of batches in flight (eventually consistent)."""
        return self._add_up(
            "total",
            IndexName=settings.BATCH_ACTIVE_INDEX_NAME,
            KeyConditionExpression=Key(_ACTIVE).eq(tenant),
            up_to=up_to,
        )

    def stored_bytes(self, tenant: str, *, up_to: int) -> int:
        """The bytes of the tenant's files, added up until they reach ``up_to`` (the owner index: eventually
        consistent)."""
        return self._add_up(
            "bytes",
            IndexName=settings.BATCH_OWNER_INDEX_NAME,
            KeyConditionExpression=Key(_OWNER).eq(owner_of(tenant, "file")),
            up_to=up_to,
        )

    def _add_up(self, attribute: str, *, up_to: int, **query: Any) -> int:
        total = 0
        kwargs: dict[str, Any] = {
            **query,
            "ProjectionExpression": "#value",
            "ExpressionAttributeNames": {"#value": attribute},
        }
        while total < up_to:
            response = self._table.query(**kwargs)
            total += sum(int(item.get(attribute, 0)) for item in response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                break
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return total

    # --- listing --------------------------------------------------------------------------------------------------

    def list(
        self,
        tenant: str,
        kind: Kind,
        *,
        limit: int,
        after: str | None = None,
        ascending: bool = False,
        purpose: str | None = None,
    ) -> tuple[list[FileRecord | BatchRecord], bool]:
        """A page of the tenant's files or batches, newest first (``ascending``: oldest first), starting after the
        object ``after``; and whether more follow. InvalidCursor when ``after`` is not one of the tenant's."""
        start = None
        if after is not None:
            item = self._get(after)
            if not item or item.get(_OWNER) != owner_of(tenant, kind):
                raise InvalidCursor(f"after: no {kind} {after}")
            start = {_PK: item[_PK], _OWNER: item[_OWNER], _SORT: item[_SORT]}
        found: list[dict[str, Any]] = []
        while len(found) <= limit:
            kwargs: dict[str, Any] = {
                "IndexName": settings.BATCH_OWNER_INDEX_NAME,
                "KeyConditionExpression": Key(_OWNER).eq(owner_of(tenant, kind)),
                "ScanIndexForward": ascending,
                "Limit": limit + 1 - len(found),
            }
            if purpose is not None:
                # The filter runs after Limit, so a page can come back short: keep reading.
                kwargs["FilterExpression"] = Attr("purpose").eq(purpose)
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._table.query(**kwargs)
            found.extend(response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                break
        records = [self._record(item) for item in found[:limit]]
        return records, len(found) > limit

    # --- helpers --------------------------------------------------------------------------------------------------

    def _get(self, object_id: str) -> dict[str, Any] | None:
        if not object_id:
            return None  # DynamoDB refuses an empty key outright; no object has one
        return self._table.get_item(Key={_PK: object_id}, ConsistentRead=True).get("Item")

    def _record(self, item: dict[str, Any]) -> FileRecord | BatchRecord:
        return self._batch(item) if item.get("kind") == "batch" else FileRecord.model_validate(_plain(item))

    @staticmethod
    def _batch(item: dict[str, Any]) -> BatchRecord:
        return BatchRecord.model_validate(_plain(item))
