"""Small adapters over the AWS services the job pipeline uses.

boto3 is called from adapter modules only: this one, the batches' (``async_inference/batches/aws.py``,
``async_inference/batches/store.py``), the worker's model download (``gpu_worker/model_source.py``) and the
operator's account checks before a first deploy (``async_inference/preflight.py``);
``tests/unit/test_aws_adapters.py`` checks that no other module of the service imports it.

Each adapter takes its boto3 client or resource in the constructor so a process builds its clients once (module level
in a Lambda, once per worker) and tests can hand in clients pointed at a moto server. ``AWS_ENDPOINT_URL``, which
boto3 honours by itself, is how the local runtime points everything at moto.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from boto3.dynamodb.conditions import Attr, Key
from botocore.config import Config
from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.jobs import FINAL_STATES, JobStatus, sources_of
from async_inference.schemas import (
    BatchControl,
    ClaimCheck,
    Job,
    JobActivity,
    JobProgress,
    ResultNotification,
    Subscription,
    UploadDeadline,
    utcnow,
)

# Retries with backoff for throttling live in botocore ("standard" mode); anything still failing is an infrastructure
# fault that the caller lets surface (the worker leaves the message for redelivery).
# A client's connection pool is as large as the most requests a process makes at once (the worker's I/O threads, which
# it caps at this); a smaller pool discards and reopens connections under load.
MAX_CONCURRENT_REQUESTS = 128
_BOTO_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=MAX_CONCURRENT_REQUESTS)


def _s3_config() -> Config:
    # A local endpoint (moto) cannot serve virtual-hosted buckets (bucket.127.0.0.1), so presigned URLs and calls use
    # path-style addressing there; against AWS the default (virtual-hosted) is kept.
    if os.environ.get("AWS_ENDPOINT_URL"):
        return _BOTO_CONFIG.merge(Config(s3={"addressing_style": "path"}, signature_version="s3v4"))
    return _BOTO_CONFIG.merge(Config(signature_version="s3v4"))


def client(service: str) -> Any:
    """A boto3 client with the project's retry settings."""
    return boto3.client(service, config=_s3_config() if service == "s3" else _BOTO_CONFIG)


def is_error(exc: BaseException, *codes: str) -> bool:
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in codes


# --- DynamoDB -------------------------------------------------------------------------------------------------------

# Key names the stack declares (settings) and the Job model's fields use.
_PK = settings.TABLE_PARTITION_KEY
_TENANT = settings.TENANT_INDEX_PARTITION_KEY
_SORT = settings.TENANT_INDEX_SORT_KEY
_ACTIVE = settings.ACTIVE_JOBS_ATTRIBUTE


def _to_item(job: Job) -> dict[str, Any]:
    item = {k: v for k, v in job.model_dump(mode="json").items() if v is not None}
    # Sort key of the tenant index: ISO timestamps sort chronologically as strings; the id breaks ties.
    item[_SORT] = f"{item['created_at']}#{job.job_id}"
    if job.status not in FINAL_STATES:
        item[_ACTIVE] = job.tenant  # in the index of unfinished jobs (quotas) until the write that makes it final
    return item


def _from_item(item: dict[str, Any]) -> Job:
    return Job.model_validate(item)


def _encode_token(key: dict[str, Any] | None) -> str | None:
    if not key:
        return None
    return base64.urlsafe_b64encode(json.dumps(key, default=str).encode()).decode()


def _decode_token(token: str) -> dict[str, Any]:
    """The opaque ``next`` token back into an ExclusiveStartKey; ValueError when it is not one of ours."""
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError) as exc:
        raise ValueError("'next' is not a token this API returned") from exc
    if not isinstance(key, dict) or set(key) != {_PK, _TENANT, _SORT}:
        raise ValueError("'next' is not a token this API returned")
    return key


def put_new(table: Any, item: dict[str, Any], key: str) -> bool:
    """PutItem only if no item has this ``key`` attribute's value yet; False when one has (an idempotent retry)."""
    try:
        table.put_item(Item=item, ConditionExpression=Attr(key).not_exists())
    except ClientError as exc:
        if is_error(exc, "ConditionalCheckFailedException"):
            return False
        raise
    return True


def append_webhook_attempt(table: Any, key: dict[str, str], attempt: dict[str, Any], *, status: str | None) -> bool:
    """Append one delivery attempt to the ``webhook`` of the item at ``key`` (a job's or a batch's), and set its
    status; False when the item or its webhook is gone. ``list_append`` makes concurrent appends safe without reading
    the item first."""
    update = "SET #webhook.#attempts = list_append(if_not_exists(#webhook.#attempts, :empty), :attempt)"
    names = {"#webhook": "webhook", "#attempts": "attempts"}
    values: dict[str, Any] = {":empty": [], ":attempt": [attempt]}
    if status is not None:
        update += ", #webhook.#status = :status"
        names["#status"] = "status"
        values[":status"] = status
    try:
        table.update_item(
            Key=key,
            UpdateExpression=update,
            ConditionExpression=Attr("webhook").exists(),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
    except ClientError as exc:
        if is_error(exc, "ConditionalCheckFailedException"):
            return False
        raise
    return True


class JobStore:
    """Job state in DynamoDB. Every state change is conditional on the job's current state (see ``jobs.py``)."""

    def __init__(self, table_name: str, dynamodb: Any | None = None) -> None:
        self._dynamodb = dynamodb or boto3.resource("dynamodb", config=_BOTO_CONFIG)
        self._table = self._dynamodb.Table(table_name)

    def create(self, job: Job) -> bool:
        """Store a new job; False when a job with this id exists already (an idempotent retry)."""
        return put_new(self._table, _to_item(job), _PK)

    def get(self, job_id: str) -> Job | None:
        item = self._table.get_item(Key={_PK: job_id}, ConsistentRead=True).get("Item")
        return _from_item(item) if item else None

    def delete(self, job_id: str) -> None:
        """Remove a job's record (a deleted background response's job); nothing when there is none."""
        self._table.delete_item(Key={_PK: job_id})

    def get_many(self, job_ids: Iterable[str]) -> dict[str, Job]:
        """Current state of up to 100 jobs in one request (the worker's cancellation check)."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return {}
        found: dict[str, Job] = {}
        request = {self._table.name: {"Keys": [{_PK: i} for i in ids], "ConsistentRead": True}}
        while request:
            response = self._dynamodb.batch_get_item(RequestItems=request)
            for item in response.get("Responses", {}).get(self._table.name, []):
                job = _from_item(item)
                found[job.job_id] = job
            request = response.get("UnprocessedKeys") or {}
        return found

    def transition(
        self,
        job_id: str,
        target: JobStatus,
        *,
        tenant: str | None = None,
        count_attempt: bool = False,
        only_from: Iterable[JobStatus] | None = None,
        lease: tuple[str, int] | None = None,
        **fields: Any,
    ) -> Job | None:
        """Move a job to ``target`` if its current state allows it, setting ``fields``; the new job, or None when the
        move was not allowed (already final, cancelled, unknown id, or another tenant's job). ``only_from`` narrows
        the states the move may leave (an upload expiry must not expire a job its upload just queued). ``lease``
        (owner, milliseconds): a move to running takes the job's lease for that long, and moves a running job only
        when its lease has lapsed or is the owner's own (async_inference/jobs.py)."""
        now = utcnow()
        values: dict[str, Any] = {"status": target.value, "updated_at": now.isoformat()}
        now_ms = int(now.timestamp() * 1000)
        if lease is not None:
            if target is not JobStatus.RUNNING:
                raise ValueError("a lease is taken by a move to running only")
            values["lease_owner"], values["lease_expires_ms"] = lease[0], now_ms + lease[1]
        if target in FINAL_STATES:
            values["finished_at"] = now.isoformat()
            values[settings.TABLE_TTL_ATTRIBUTE] = int(now.timestamp()) + settings.JOB_RECORD_RETENTION_DAYS * 86400
        for name, value in fields.items():
            values[name] = _json_value(value)
        names = {f"#{k}": k for k in values}
        expr_values = {f":{k}": v for k, v in values.items()}
        update = "SET " + ", ".join(f"#{k} = :{k}" for k in values)
        if count_attempt:
            update += " ADD #attempts :one"
            names["#attempts"] = "attempts"
            expr_values[":one"] = 1
        if target in FINAL_STATES:
            # Out of the index of unfinished jobs in the same write: a tenant's quota count can never drift.
            update += " REMOVE #active"
            names["#active"] = _ACTIVE
        sources = sources_of(target) if only_from is None else sources_of(target) & frozenset(only_from)
        if not sources:
            raise ValueError(f"no state in {only_from} may move to {target.value}")
        condition = Attr("status").is_in([s.value for s in sources])
        if lease is not None and JobStatus.RUNNING in sources:
            # Running already: only a holder that is gone (its lease lapsed: its messages are visible again) or this
            # owner itself gives it up. Items from before leases have none, and move as they always did.
            lapsed = (
                Attr("lease_expires_ms").not_exists()
                | Attr("lease_expires_ms").lt(now_ms)
                | Attr("lease_owner").eq(lease[0])
            )
            others = [s.value for s in sources if s is not JobStatus.RUNNING]
            running = Attr("status").eq(JobStatus.RUNNING.value) & lapsed
            condition = (Attr("status").is_in(others) | running) if others else running
        if tenant is not None:
            condition = condition & Attr(_TENANT).eq(tenant)
        try:
            response = self._table.update_item(
                Key={_PK: job_id},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=expr_values,
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if is_error(exc, "ConditionalCheckFailedException"):
                return None
            raise
        return _from_item(response["Attributes"])

    def renew_leases(self, owner: str, job_ids: Iterable[str], lease_ms: int) -> list[str]:
        """Extend ``owner``'s leases on its running jobs by ``lease_ms`` from now (one UpdateItem each: DynamoDB has no
        batched conditional update); the ids whose lease is no longer the owner's (taken over, or the job ended)."""
        expires_ms = int(utcnow().timestamp() * 1000) + lease_ms
        lost: list[str] = []
        for job_id in job_ids:
            try:
                self._table.update_item(
                    Key={_PK: job_id},
                    UpdateExpression="SET #expires = :expires",
                    ConditionExpression="#owner = :owner AND #status = :running",
                    ExpressionAttributeNames={
                        "#expires": "lease_expires_ms",
                        "#owner": "lease_owner",
                        "#status": "status",
                    },
                    ExpressionAttributeValues={
                        ":expires": expires_ms,
                        ":owner": owner,
                        ":running": JobStatus.RUNNING.value,
                    },
                )
            except ClientError as exc:
                if not is_error(exc, "ConditionalCheckFailedException"):
                    raise
                lost.append(job_id)
        return lost

    def update(self, job_id: str, **fields: Any) -> None:
        """Set fields that are not part of the state machine (an upload job's ``claim_sent_at``)."""
        names = {f"#{k}": k for k in fields}
        values = {f":{k}": _json_value(v) for k, v in fields.items()}
        self._table.update_item(
            Key={_PK: job_id},
            UpdateExpression="SET " + ", ".join(f"#{k} = :{k}" for k in fields),
            ConditionExpression=Attr(_PK).exists(),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )

    def record_webhook_attempt(self, job_id: str, attempt: dict[str, Any], *, status: str | None = None) -> bool:
        """Append one delivery attempt to the job's webhook (and set its status); False when the job or its webhook
        is gone."""
        return append_webhook_attempt(self._table, {_PK: job_id}, attempt, status=status)

    def mark_notified(self, job_ids: list[str]) -> None:
        """Record that these jobs' notifications went out: one UpdateItem each. Not one TransactWriteItems for the
        lot: a transaction costs two write units per item rather than one, and one conflicting write (a duplicate
        delivery settling the same job) or one missing item would cancel the marks of every job in it. A job whose
        item is gone (expired by TTL) has nothing left to mark and is skipped."""
        for job_id in job_ids:
            try:
                self._table.update_item(
                    Key={_PK: job_id},
                    UpdateExpression="SET #notified = :true",
                    ConditionExpression="attribute_exists(#pk)",
                    ExpressionAttributeNames={"#notified": "notified", "#pk": _PK},
                    ExpressionAttributeValues={":true": True},
                )
            except ClientError as exc:
                if not is_error(exc, "ConditionalCheckFailedException"):
                    raise

    def record_progress(self, job_id: str, progress: JobProgress) -> bool:
        """Set a running job's progress (one UpdateItem); False when the job is no longer running (it ended, or was
        cancelled, meanwhile), which leaves it untouched."""
        try:
            self._table.update_item(
                Key={_PK: job_id},
                UpdateExpression="SET #progress = :progress",
                ConditionExpression="#status = :running",
                ExpressionAttributeNames={"#progress": "progress", "#status": "status"},
                ExpressionAttributeValues={":progress": _json_value(progress), ":running": JobStatus.RUNNING.value},
            )
        except ClientError as exc:
            if is_error(exc, "ConditionalCheckFailedException"):
                return False
            raise
        return True

    def list_for_tenant(
        self, tenant: str, *, status: JobStatus | None, limit: int, next_token: str | None
    ) -> tuple[list[Job], str | None]:
        """A page of the tenant's jobs, newest first. Raises ValueError for a token this API did not issue."""
        jobs: list[Job] = []
        start = _decode_token(next_token) if next_token else None
        if start is not None and start[_TENANT] != tenant:
            raise ValueError("'next' is not a token this API returned")
        while True:
            kwargs: dict[str, Any] = {
                "IndexName": settings.TENANT_INDEX_NAME,
                "KeyConditionExpression": Key(_TENANT).eq(tenant),
                "ScanIndexForward": False,
                "Limit": limit - len(jobs),
            }
            if status is not None:
                # The filter runs after Limit is applied, so a page can come back short: keep reading.
                kwargs["FilterExpression"] = Attr("status").eq(status.value)
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._table.query(**kwargs)
            jobs.extend(_from_item(item) for item in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start or len(jobs) >= limit:
                break
        return jobs, _encode_token(start)

    def count_active(self, tenant: str, *, up_to: int) -> int:
        """How many of the tenant's jobs are unfinished, counted up to ``up_to`` (reading no further)."""
        count, start = 0, None
        while count < up_to:
            kwargs: dict[str, Any] = {
                "IndexName": settings.ACTIVE_JOBS_INDEX_NAME,
                "Select": "COUNT",
                "KeyConditionExpression": Key(_ACTIVE).eq(tenant),
                "Limit": up_to - count,
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._table.query(**kwargs)
            count += response["Count"]
            start = response.get("LastEvaluatedKey")
            if not start:
                break
        return count


def _json_value(value: Any) -> Any:
    if isinstance(value, JobStatus):
        return value.value
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if hasattr(value, "model_dump"):
        return {k: v for k, v in value.model_dump(mode="json").items() if v is not None}
    if isinstance(value, float):
        raise TypeError("DynamoDB needs Decimal, not float: store floats as strings or ints")
    return value


# --- S3 -------------------------------------------------------------------------------------------------------------


class PayloadTooLarge(Exception):
    pass


class Blobs:
    """Request and result objects in the claim-check bucket."""

    def __init__(self, bucket: str, s3: Any | None = None) -> None:
        self.bucket = bucket
        self._s3 = s3 or client("s3")

    def put_json(self, key: str, body: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")

    def put_json_once(
        self,
        key: str,
        body: bytes,
        *,
        bucket: str | None = None,
        content_type: str = "application/json",
        max_bytes: int = settings.MAX_UPLOAD_BYTES,
    ) -> bytes | None:
        """Write ``body`` unless the key exists (S3 conditional write); the existing object's bytes if it did."""
        try:
            self._s3.put_object(
                Bucket=bucket or self.bucket, Key=key, Body=body, ContentType=content_type, IfNoneMatch="*"
            )
        except ClientError as exc:
            if is_error(exc, "PreconditionFailed", "ConditionalRequestConflict", "412"):
                return self.get(key, max_bytes=max_bytes, bucket=bucket)
            raise
        return None

    def get_range(self, key: str, first_byte: int, last_byte: int, *, bucket: str | None = None) -> bytes:
        """Bytes ``first_byte`` to ``last_byte`` (inclusive, as an HTTP Range) of an object; KeyError when absent."""
        try:
            response = self._s3.get_object(
                Bucket=bucket or self.bucket, Key=key, Range=f"bytes={first_byte}-{last_byte}"
            )
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "NoSuchBucket"):
                raise KeyError(key) from exc
            raise
        return response["Body"].read()

    def get(self, key: str, *, max_bytes: int, bucket: str | None = None) -> bytes:
        """The object's bytes; KeyError when absent, PayloadTooLarge when over ``max_bytes``."""
        try:
            response = self._s3.get_object(Bucket=bucket or self.bucket, Key=key)
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "NoSuchBucket"):
                raise KeyError(key) from exc
            if is_error(exc, "AccessDenied", "403") and not self._listed(bucket or self.bucket, key):
                raise KeyError(key) from exc
            raise
        if response["ContentLength"] > max_bytes:
            response["Body"].close()
            raise PayloadTooLarge(f"{response['ContentLength']} bytes, limit {max_bytes}")
        return response["Body"].read()

    def _listed(self, bucket: str, key: str) -> bool:
        """Whether a listing shows ``key``: settles a GetObject answered 403, which S3 gives for a missing key to a
        caller whose s3:ListBucket does not cover it (the stack grants ListBucket only with an s3:prefix condition,
        which a ListObjectsV2 with ``Prefix=key`` meets). True when the listing is refused too: the 403 stands."""
        try:
            listing = self._s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        except ClientError:
            return True
        return any(item["Key"] == key for item in listing.get("Contents", []))

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=key)

    def written_at(self, key: str) -> dt.datetime | None:
        """When the object was last written (S3's LastModified, whole seconds); None when it is absent."""
        try:
            return self._s3.head_object(Bucket=self.bucket, Key=key)["LastModified"]
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "NotFound"):
                return None
            raise

    def presign_put(self, key: str, *, size_bytes: int, expires_s: int) -> tuple[str, dict[str, str]]:
        """A SigV4 presigned PUT. Content-Length and Content-Type are signed, so S3 refuses a body of another size."""
        headers = {"Content-Type": "application/json", "Content-Length": str(size_bytes)}
        url = self._s3.generate_presigned_url(
            "put_object",
            Params={"Bucket": self.bucket, "Key": key, "ContentType": "application/json", "ContentLength": size_bytes},
            ExpiresIn=expires_s,
        )
        return url, headers

    def presign_get(self, key: str, *, expires_s: int) -> str:
        return self._s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_s
        )


# --- SQS ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueMessage:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    queue_url: str | None = None  # the queue it was received from (receipt handles are valid there only)


MAX_DELAY_S = 900  # SQS's longest DelaySeconds


class JobQueue:
    """The claim-check queue."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def send(self, claim: ClaimCheck) -> None:
        # The tenant as message group: on a standard queue it is what SQS fair queues tell tenants apart by (a tenant
        # with a backlog is served after quiet ones); without fair queues (moto) it changes nothing.
        self._sqs.send_message(
            QueueUrl=self.url, MessageBody=claim.model_dump_json(exclude_none=True), MessageGroupId=claim.tenant
        )

    def requeue(self, messages: list[tuple[QueueMessage, str]], *, delay_s: int = 0) -> list[str]:
        """Send each (message, tenant) received from this queue again at the tail, as a new message (its receive
        count starts over) hidden for ``delay_s`` (at most SQS's 900), and delete the received one; the receipt
        handles not requeued (a failed send: that message returns after its visibility timeout; a failed delete:
        both copies stay, and the job's lease lets only one run). Up to 10 per request."""
        failed: list[str] = []
        for start in range(0, len(messages), settings.RECEIVE_BATCH_SIZE):
            chunk = messages[start : start + settings.RECEIVE_BATCH_SIZE]
            entries = [
                {"Id": str(i), "MessageBody": m.body, "MessageGroupId": tenant}
                | ({"DelaySeconds": min(delay_s, MAX_DELAY_S)} if delay_s > 0 else {})
                for i, (m, tenant) in enumerate(chunk)
            ]
            response = self._sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
            unsent = {int(f["Id"]) for f in response.get("Failed", [])}
            failed.extend(chunk[i][0].receipt_handle for i in sorted(unsent))
            sent = [m.receipt_handle for i, (m, _) in enumerate(chunk) if i not in unsent]
            if sent:
                failed.extend(self.delete_batch(sent))
        return failed

    def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int | None = None) -> list[QueueMessage]:
        """Up to ``max_messages`` messages, hidden for ``visibility_timeout_s`` (the queue's default when None)."""
        extra = {} if visibility_timeout_s is None else {"VisibilityTimeout": visibility_timeout_s}
        response = self._sqs.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=max(1, min(max_messages, settings.RECEIVE_BATCH_SIZE)),
            WaitTimeSeconds=wait_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
            **extra,
        )
        return [
            QueueMessage(
                message_id=m["MessageId"],
                receipt_handle=m["ReceiptHandle"],
                body=m["Body"],
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                queue_url=self.url,
            )
            for m in response.get("Messages", [])
        ]

    def delete_batch(self, receipt_handles: list[str]) -> list[str]:
        """Delete up to 10 messages in one request; the handles that failed."""
        return self._batch("delete_message_batch", [{"ReceiptHandle": h} for h in receipt_handles])

    def change_visibility_batch(self, receipt_handles: list[str], timeout_s: int) -> list[str]:
        """Set the visibility timeout of up to 10 messages in one request; the handles that failed."""
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": timeout_s} for h in receipt_handles]
        return self._batch("change_message_visibility_batch", entries)

    def _batch(self, operation: str, entries: list[dict[str, Any]]) -> list[str]:
        failed: list[str] = []
        for start in range(0, len(entries), settings.RECEIVE_BATCH_SIZE):
            chunk = [dict(e, Id=str(i)) for i, e in enumerate(entries[start : start + settings.RECEIVE_BATCH_SIZE])]
            response = getattr(self._sqs, operation)(QueueUrl=self.url, Entries=chunk)
            failed.extend(chunk[int(f["Id"])]["ReceiptHandle"] for f in response.get("Failed", []))
        return failed


class ControlQueue:
    """The batch control queue: steps of a batch for the batch controller (``BatchControl``: plan, finalize)."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def send(self, control: BatchControl) -> None:
        self._sqs.send_message(QueueUrl=self.url, MessageBody=control.model_dump_json())


SQS_MAX_DELAY_S = 900


class UploadDeadlines:
    """The upload-deadline queue: one message per upload job, delayed to the end of its presign window."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def schedule(self, job_id: str, delay_s: int) -> None:
        """Deliver the job's deadline after ``delay_s`` (clipped to SQS's 0..900 s; the handler hides a message that
        arrives before the window and its grace are over)."""
        body = UploadDeadline(job_id=job_id).model_dump_json()
        self._sqs.send_message(QueueUrl=self.url, MessageBody=body, DelaySeconds=max(0, min(delay_s, SQS_MAX_DELAY_S)))

    def hide(self, receipt_handle: str, seconds: int) -> None:
        """Deliver a received deadline again after ``seconds``."""
        self._sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds)


class WebhookQueue:
    """The webhook dispatcher's queue: the result topic feeds it; the worker sends "started" events to it directly."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def send(self, body: str) -> None:
        self._sqs.send_message(QueueUrl=self.url, MessageBody=body)

    def hide(self, receipt_handle: str, seconds: int) -> None:
        """Make a received message visible again only after ``seconds`` (the retry backoff)."""
        self._sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds)


# --- SNS ------------------------------------------------------------------------------------------------------------


class Notifier:
    """Publishes result notifications with the attributes subscriptions filter on."""

    def __init__(self, topic_arn: str, sns: Any | None = None) -> None:
        self.topic_arn = topic_arn
        self._sns = sns or client("sns")

    def publish(self, notification: ResultNotification, *, has_webhook: bool = False) -> None:
        self._sns.publish(
            TopicArn=self.topic_arn,
            Message=notification.model_dump_json(exclude_none=True),
            MessageAttributes=notification_attributes(notification, has_webhook=has_webhook),
            # The tenant as message group: SNS forwards it to the SQS standard queues subscribed (the webhook queue),
            # where it makes them fair queues: one tenant's backlog of events does not hold another's back.
            MessageGroupId=notification.tenant,
        )

    def publish_batch(self, notifications: list[tuple[ResultNotification, bool]]) -> list[bool]:
        """Publish (notification, has_webhook) pairs in as few PublishBatch requests as SNS allows (10 entries and
        256 KB a request); whether each one was published, in order."""
        published = [False] * len(notifications)
        chunk: list[int] = []
        size = 0
        bodies = [n.model_dump_json(exclude_none=True) for n, _ in notifications]
        for index, body in enumerate(bodies):
            # Attributes count towards the limit too; 1 KB a message covers them.
            entry_size = len(body.encode()) + 1024
            if chunk and (len(chunk) == SNS_BATCH_ENTRIES or size + entry_size > SNS_BATCH_BYTES):
                self._publish_chunk(chunk, notifications, bodies, published)
                chunk, size = [], 0
            chunk.append(index)
            size += entry_size
        if chunk:
            self._publish_chunk(chunk, notifications, bodies, published)
        return published

    def _publish_chunk(
        self,
        chunk: list[int],
        notifications: list[tuple[ResultNotification, bool]],
        bodies: list[str],
        published: list[bool],
    ) -> None:
        entries = [
            {
                "Id": str(i),
                "Message": bodies[i],
                "MessageAttributes": notification_attributes(notifications[i][0], has_webhook=notifications[i][1]),
                "MessageGroupId": notifications[i][0].tenant,  # as publish's
            }
            for i in chunk
        ]
        response = self._sns.publish_batch(TopicArn=self.topic_arn, PublishBatchRequestEntries=entries)
        for success in response.get("Successful", []):
            published[int(success["Id"])] = True


# SNS PublishBatch limits.
SNS_BATCH_ENTRIES = 10
SNS_BATCH_BYTES = 256 * 1024


def notification_attributes(
    notification: ResultNotification, *, has_webhook: bool = False
) -> dict[str, dict[str, str]]:
    attributes = {
        "status": {"DataType": "String", "StringValue": notification.status.value},
        "tenant": {"DataType": "String", "StringValue": notification.tenant},
        settings.WEBHOOK_ATTRIBUTE: {"DataType": "String", "StringValue": "true" if has_webhook else "false"},
        settings.EVENT_ATTRIBUTE: {"DataType": "String", "StringValue": notification.event},
    }
    if notification.model:
        attributes["model"] = {"DataType": "String", "StringValue": notification.model}
    return attributes


# --- ECS ------------------------------------------------------------------------------------------------------------

# The wake from zero runs inside a submit: one attempt with short timeouts, so an ECS endpoint that does not answer
# holds a submit up by 3 s at most (and once a minute per process); the scaling alarms wake the service regardless.
_WAKE_CONFIG = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1, read_timeout=2)


# The one scheduled action the wake keeps on the worker service's scalable target: the end of its hold.
WAKE_HOLD_RELEASE = "wake-hold-release"


class WorkerService:
    """The GPU workers' ECS service, as the wake from zero sees it: its desired task count, read and set, and its
    scaling minimum, held for a while."""

    def __init__(self, cluster: str, service: str, ecs: Any | None = None) -> None:
        self.cluster = cluster
        self.service = service
        self._ecs = ecs or boto3.client("ecs", config=_WAKE_CONFIG)

    def desired_count(self) -> int:
        response = self._ecs.describe_services(cluster=self.cluster, services=[self.service])
        if not response.get("services"):
            raise LookupError(f"no ECS service {self.service} in cluster {self.cluster}: {response.get('failures')}")
        return int(response["services"][0]["desiredCount"])

    def set_desired_count(self, count: int) -> None:
        self._ecs.update_service(cluster=self.cluster, service=self.service, desiredCount=count)

    def hold(
        self,
        *,
        release_at: dt.datetime,
        maximum: int | None = None,
        restore_max: int | None = None,
        autoscaling: Any | None = None,
    ) -> None:
        """Hold the service's Application Auto Scaling minimum at 1 until ``release_at`` (UTC), and with ``maximum``
        and ``restore_max`` its maximum at ``maximum``. The release (a one-time scheduled action that puts the minimum
        back to 0 and the maximum to ``restore_max``, replacing the previous one) is put first: if the raise then
        fails, nothing is left held."""
        scaling = autoscaling or self._autoscaling()
        target = {
            "ServiceNamespace": "ecs",
            "ScalableDimension": "ecs:service:DesiredCount",
            "ResourceId": f"service/{self.cluster.split('/')[-1]}/{self.service.split('/')[-1]}",
        }
        held, released = {"MinCapacity": 1}, {"MinCapacity": 0}
        if maximum is not None and restore_max is not None:
            held["MaxCapacity"], released["MaxCapacity"] = maximum, restore_max
        scaling.put_scheduled_action(
            **target,
            ScheduledActionName=WAKE_HOLD_RELEASE,
            Schedule=f"at({release_at.strftime('%Y-%m-%dT%H:%M:%S')})",
            ScalableTargetAction=released,
        )
        scaling.register_scalable_target(**target, **held)

    def _autoscaling(self) -> Any:
        if getattr(self, "_scaling", None) is None:
            self._scaling = boto3.client("application-autoscaling", config=_WAKE_CONFIG)
        return self._scaling


class CapacityGroup:
    """The GPU Auto Scaling group behind the worker service, as the wake sees it: its desired capacity, read and raised.

    A wake that finds the group at 0 sets it to 1 itself (SetDesiredCapacity), so that the instance launches (or
    leaves the warm pool) at once instead of after ECS managed scaling's next CapacityProviderReservation minute. It
    never lowers the count: a group above 0 already has capacity coming or running."""

    def __init__(self, name: str, autoscaling: Any | None = None) -> None:
        self.name = name
        self._autoscaling = autoscaling or boto3.client("autoscaling", config=_WAKE_CONFIG)

    def desired_capacity(self) -> int:
        groups = self._autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[self.name])["AutoScalingGroups"]
        if not groups:
            raise LookupError(f"no Auto Scaling group {self.name}")
        return int(groups[0]["DesiredCapacity"])

    def set_desired_capacity(self, count: int) -> None:
        # HonorCooldown False: the group's cooldown is for its own scaling policies, and this start answers a job.
        self._autoscaling.set_desired_capacity(
            AutoScalingGroupName=self.name, DesiredCapacity=count, HonorCooldown=False
        )


# --- API Gateway ----------------------------------------------------------------------------------------------------


class TenantDirectory:
    """Tenant of an API Gateway API key: the key's name. Cached, since keys are not renamed."""

    def __init__(self, apigateway: Any | None = None) -> None:
        self._apigateway = apigateway or client("apigateway")
        self._cache: dict[str, str | None] = {}

    def tenant_of(self, api_key_id: str) -> str | None:
        if api_key_id not in self._cache:
            try:
                self._cache[api_key_id] = self._apigateway.get_api_key(apiKey=api_key_id, includeValue=False)["name"]
            except ClientError as exc:
                if not is_error(exc, "NotFoundException"):
                    raise
                self._cache[api_key_id] = None
        return self._cache[api_key_id]


# --- Job events: the job event topic --------------------------------------------------------------------------------


def activity_attributes(activity: JobActivity) -> dict[str, dict[str, str]]:
    return {
        settings.EVENT_ATTRIBUTE: {"DataType": "String", "StringValue": activity.event},
        "tenant": {"DataType": "String", "StringValue": activity.tenant},
    }


class JobEvents:
    """Publishes running jobs' news (``JobActivity``: job.started, job.progress) to the job event topic, up to ten
    messages per PublishBatch request (each is well under 1 KB, so ten never reach the 256 KB limit)."""

    def __init__(self, topic_arn: str, sns: Any | None = None) -> None:
        self.topic_arn = topic_arn
        self._sns = sns or client("sns")

    def publish_batch(self, activities: list[JobActivity]) -> list[bool]:
        """Whether each one was published, in order."""
        published = [False] * len(activities)
        for start in range(0, len(activities), SNS_BATCH_ENTRIES):
            entries = [
                {
                    "Id": str(i),
                    "Message": a.model_dump_json(exclude_none=True),
                    "MessageAttributes": activity_attributes(a),
                }
                for i, a in enumerate(activities[start : start + SNS_BATCH_ENTRIES])
            ]
            response = self._sns.publish_batch(TopicArn=self.topic_arn, PublishBatchRequestEntries=entries)
            for success in response.get("Successful", []):
                published[start + int(success["Id"])] = True
        return published


# --- The WebSocket API: connections and the management API ---------------------------------------------------


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
        self._table = (dynamodb or boto3.resource("dynamodb", config=_BOTO_CONFIG)).Table(table_name)

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
            "apigatewaymanagementapi", endpoint_url=endpoint_url, config=_BOTO_CONFIG
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


class ApiKeyValues:
    """Every API key of the account in the region, with its value: key id -> (value, enabled), from ``GetApiKeys``
    pages of ``PAGE_SIZE`` (one call up to that many keys)."""

    PAGE_SIZE = 500  # GetApiKeys' largest page (its limit parameter, API Gateway REST API reference)

    def __init__(self, apigateway: Any | None = None) -> None:
        self._apigateway = apigateway or client("apigateway")

    def __call__(self) -> dict[str, tuple[str, bool]]:
        found: dict[str, tuple[str, bool]] = {}
        position: dict[str, str] = {}
        while True:
            page = self._apigateway.get_api_keys(includeValues=True, limit=self.PAGE_SIZE, **position)
            for key in page.get("items", []):
                found[key["id"]] = (key["value"], bool(key.get("enabled", True)))
            if not page.get("position"):
                return found
            position = {"position": page["position"]}
