"""The job table in DynamoDB: its key names, the conditional writes it shares with the batch table (``put_new``,
``append_webhook_attempt``), and ``JobStore``, every job's state moved only by the state machine's rules."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

import boto3
from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.aws.clients import BOTO_CONFIG, is_error
from async_inference.jobs import FINAL_STATES, JobStatus, sources_of
from async_inference.schemas import Job, JobProgress, utcnow

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
        self._dynamodb = dynamodb or boto3.resource("dynamodb", config=BOTO_CONFIG)
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
        """How many of the tenant's jobs are unfinished, counted up to ``up_to`` (reading no more)."""
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
