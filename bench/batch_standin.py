"""STAND-IN for the API side of batches, until it is merged: the bench and the worker tests drive the worker with it.

What it stands in for (docs/design/batches.md), and what replaces it:

* ``StandInBatchStore``: ``async_inference.batches.store.BatchStore``, with the two methods the worker calls
  (``statuses``, ``record_chunk``) as the contract gives them, plus ``create``/``set_status``/``get`` for the driver.
  Its item layout is its own (``id``, ``status``, ``tenant``, ``chunks``, ``total``, ``counted_chunks``,
  ``completed``, ``failed``), not the real table's;
* ``create_batch_resources``: the batch-lane queue, the control queue and the batch table that ``cdk/batches.py``
  declares (the template does not have them yet, so they are created in moto directly);
* ``plan`` / ``submit_batch``: the Files API's upload and the controller's planning: the input file in S3 at
  ``settings.file_key``, read back once (the controller streams it to validate and plan), the batch item, one
  ``ChunkClaimCheck`` per ``settings.BATCH_CHUNK_LINES`` lines sent to the batch lane in batches of ten;
* ``finalize_batch``: the controller's finalize: both parts of every chunk read and concatenated into one output
  file and one error file, the batch marked completed.

Each method makes the one request the real adapter would (a BatchGetItem, a conditional UpdateItem), so the
requests counted through it are the ones a deployment makes.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from dataclasses import dataclass
from typing import Any, Iterable

from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.aws import client, is_error
from async_inference.schemas import ChunkClaimCheck, utcnow


@dataclass(frozen=True)
class ChunkRecorded:
    counted: bool  # this call counted the chunk (False: it was counted before)
    all_counted: bool  # every chunk of the batch is counted now


class StandInBatchStore:
    """STAND-IN for ``BatchStore`` (see the module docstring)."""

    def __init__(self, table_name: str, dynamodb: Any | None = None) -> None:
        self._dynamodb = dynamodb or client("dynamodb")
        self.table_name = table_name

    def create(self, batch_id: str, tenant: str, *, chunks: int, total: int, status: str = "in_progress") -> None:
        self._dynamodb.put_item(TableName=self.table_name, Item={
            "id": {"S": batch_id}, "tenant": {"S": tenant}, "status": {"S": status}, "chunks": {"N": str(chunks)},
            "total": {"N": str(total)}, "completed": {"N": "0"}, "failed": {"N": "0"},
        })

    def set_status(self, batch_id: str, status: str) -> None:
        self._dynamodb.update_item(TableName=self.table_name, Key={"id": {"S": batch_id}},
                                   UpdateExpression="SET #s = :s", ExpressionAttributeNames={"#s": "status"},
                                   ExpressionAttributeValues={":s": {"S": status}})

    def get(self, batch_id: str) -> dict[str, Any]:
        item = self._dynamodb.get_item(TableName=self.table_name, Key={"id": {"S": batch_id}},
                                       ConsistentRead=True)["Item"]
        return {
            "status": item["status"]["S"], "chunks": int(item["chunks"]["N"]), "total": int(item["total"]["N"]),
            "completed": int(item["completed"]["N"]), "failed": int(item["failed"]["N"]),
            "counted_chunks": sorted(int(n) for n in item.get("counted_chunks", {}).get("NS", [])),
        }

    # --- the two methods the worker calls ---------------------------------------------------------------------------

    def statuses(self, batch_ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(batch_ids))
        if not ids:
            return {}
        if len(ids) > 100:
            raise ValueError(f"at most 100 batches a request, got {len(ids)}")
        found: dict[str, str] = {}
        request = {self.table_name: {"Keys": [{"id": {"S": i}} for i in ids], "ConsistentRead": True,
                                     "ProjectionExpression": "id, #s", "ExpressionAttributeNames": {"#s": "status"}}}
        while request:
            response = self._dynamodb.batch_get_item(RequestItems=request)
            for item in response.get("Responses", {}).get(self.table_name, []):
                found[item["id"]["S"]] = item["status"]["S"]
            request = response.get("UnprocessedKeys") or {}
        return found

    def record_chunk(self, batch_id: str, chunk: int, *, completed: int, failed: int) -> ChunkRecorded:
        try:
            item = self._dynamodb.update_item(
                TableName=self.table_name, Key={"id": {"S": batch_id}},
                UpdateExpression="ADD counted_chunks :chunk, completed :completed, failed :failed",
                ConditionExpression="attribute_exists(id) AND NOT contains(counted_chunks, :n)",
                ExpressionAttributeValues={":chunk": {"NS": [str(chunk)]}, ":n": {"N": str(chunk)},
                                           ":completed": {"N": str(completed)}, ":failed": {"N": str(failed)}},
                ReturnValues="ALL_NEW",
            )["Attributes"]
            counted = True
        except ClientError as exc:
            if not is_error(exc, "ConditionalCheckFailedException"):
                raise
            item = self._dynamodb.get_item(TableName=self.table_name, Key={"id": {"S": batch_id}},
                                           ConsistentRead=True)["Item"]
            counted = False
        return ChunkRecorded(counted=counted,
                             all_counted=len(item.get("counted_chunks", {}).get("NS", [])) >= int(item["chunks"]["N"]))


@dataclass(frozen=True)
class BatchResources:
    batch_queue_url: str
    control_queue_url: str
    table_name: str

    def worker_env(self) -> dict[str, str]:
        from async_inference import config

        return {config.ENV_BATCH_QUEUE_URL: self.batch_queue_url,
                config.ENV_BATCH_CONTROL_QUEUE_URL: self.control_queue_url, config.ENV_BATCH_TABLE: self.table_name}


def create_batch_resources(sqs: Any, dynamodb: Any, suffix: str = "") -> BatchResources:
    """STAND-IN for cdk/batches.py's queues and table, created in moto directly."""
    batch = sqs.create_queue(QueueName=f"standin-batch-lane{suffix}")["QueueUrl"]
    control = sqs.create_queue(QueueName=f"standin-batch-control{suffix}")["QueueUrl"]
    table = f"standin-batches{suffix}"
    dynamodb.create_table(TableName=table, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                          BillingMode="PAY_PER_REQUEST")
    return BatchResources(batch, control, table)


# --- the controller's planning --------------------------------------------------------------------------------------


def input_line(custom_id: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": settings.BATCH_ENDPOINT, "body": body}).encode()


def plan(data: bytes, chunk_lines: int = settings.BATCH_CHUNK_LINES) -> list[tuple[int, int, int, int]]:
    """(start_byte, end_byte inclusive, first_line, line_count) of each chunk of a JSONL file."""
    chunks, start, first, count, offset = [], 0, 1, 0, 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if count == 0:
            start, first = offset, number
        offset += len(line)
        count += 1
        if count == chunk_lines:
            chunks.append((start, offset - 1, first, count))
            count = 0
    if count:
        chunks.append((start, offset - 1, first, count))
    return chunks


@dataclass(frozen=True)
class SubmittedBatch:
    batch_id: str
    tenant: str
    chunks: int
    lines: int
    input_key: str
    claims: tuple[str, ...]  # the chunk claim checks sent, as message bodies


def submit_batch(*, s3: Any, sqs: Any, store: StandInBatchStore, bucket: str, batch_queue_url: str, tenant: str,
                 lines: list[bytes], completion_window_s: int = settings.BATCH_COMPLETION_WINDOWS["24h"],
                 timeout_s: int = settings.DEFAULT_EXECUTION_TIMEOUT_S, batch_id: str | None = None,
                 status: str = "in_progress") -> SubmittedBatch:
    """What POST /v1/files, POST /v1/batches and the controller's plan do, as the worker sees it. ``status``: the
    batch's status when its chunks are sent (the controller may send them before it leaves ``validating``)."""
    batch_id = batch_id or f"batch_{secrets.token_hex(12)}"
    file_id = f"file-{secrets.token_hex(12)}"
    data = b"\n".join(lines) + b"\n"
    key = settings.file_key(tenant, file_id)
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    chunks = plan(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    store.create(batch_id, tenant, chunks=len(chunks), total=len(lines), status=status)
    deadline = utcnow() + dt.timedelta(seconds=completion_window_s)
    claims = [
        ChunkClaimCheck(batch_id=batch_id, tenant=tenant, bucket=bucket, input_key=key, chunk=index, start_byte=start,
                        end_byte=end, first_line=first, line_count=count, deadline=deadline, timeout_s=timeout_s)
        for index, (start, end, first, count) in enumerate(chunks)
    ]
    bodies = tuple(claim.model_dump_json() for claim in claims)
    for start in range(0, len(bodies), 10):
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start:start + 10])]
        sqs.send_message_batch(QueueUrl=batch_queue_url, Entries=entries)
    return SubmittedBatch(batch_id, tenant, len(chunks), len(lines), key, bodies)


def finalize_batch(*, s3: Any, store: StandInBatchStore, bucket: str, batch: SubmittedBatch) -> dict[str, int]:
    """What the controller's finalize does: the parts, in chunk order, into one output and one error file (none
    when there are no errors, as OpenAI); the batch completed. Lines per file."""
    files: dict[str, list[bytes]] = {"output": [], "error": []}
    for chunk in range(batch.chunks):
        for kind in files:
            key = settings.batch_part_key(batch.tenant, batch.batch_id, chunk, kind)
            files[kind].append(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    counts = {}
    for kind, parts in files.items():
        data = b"".join(parts)
        counts[kind] = data.count(b"\n")
        if data or kind == "output":
            s3.put_object(Bucket=bucket, Key=settings.file_key(batch.tenant, f"file-{secrets.token_hex(12)}"), Body=data)
    store.set_status(batch.batch_id, "completed")
    return counts
