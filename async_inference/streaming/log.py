"""A job's event log: what the worker wrote of its answer while decoding, in order, durable, readable by any process.

One DynamoDB item per write (a *segment*): partition key ``job_id``, numeric sort key ``seq``, the segment's JSON in
``body``, ``expires_at`` (epoch seconds, the table's TTL) and the job's ``tenant`` (the WebSocket push, fed by the
table's stream, tells that tenant's connections only). A segment carries the text each choice gained since the
previous one (``deltas``), the completion tokens so far, and, in the last one, how the run ended (``end``). The worker
writes a segment per job at most every ``STREAM_INTERVAL_S`` (gpu_worker.deltas), so a token is never a request, and
a reader resumes from any segment by its ``seq`` (a Query with ``seq > n``).

``seq`` is ``attempt * SEQ_PER_ATTEMPT + n``: a job run again after its worker died writes after the abandoned run's
segments, never over them, and a reader tells the runs apart (``Segment.attempt``).

docs/streaming.md says why DynamoDB (and not S3) and what a thousand streamed tokens cost.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from async_inference.aws import client

PARTITION_KEY = "job_id"
SORT_KEY = "seq"
TTL_ATTRIBUTE = "expires_at"
TENANT_ATTRIBUTE = "tenant"
BODY_ATTRIBUTE = "body"
# A log outlives its job's run by this much: long enough to resume a dropped stream, short enough to cost nothing kept.
RETENTION_S = 24 * 60 * 60
SEQ_PER_ATTEMPT = 1_000_000  # segments one run may write: at 4 a second, over 69 hours


class Delta(BaseModel):
    """Text choice ``index`` gained."""

    index: int = 0
    text: str


class ToolCallEnd(BaseModel):
    id: str
    name: str
    arguments: str


class ChoiceEnd(BaseModel):
    """How choice ``index`` ended: the text it gained since the last delta (all of it when nothing was streamed while
    decoding), why it ended, and what only the end knows (tool calls, a refusal)."""

    index: int = 0
    text: str = ""
    finish_reason: str
    tool_calls: list[ToolCallEnd] = Field(default_factory=list)
    refusal: str | None = None


class End(BaseModel):
    """How the run ended: ``succeeded`` with each choice's end and the usage, or not (``failed``, ``cancelled``, ...)
    with the reason."""

    status: Literal["succeeded", "failed", "cancelled", "expired"]
    choices: list[ChoiceEnd] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    system_fingerprint: str | None = None
    error: str | None = None
    # The request's fault (``context_length_exceeded``, ``invalid_request``: the job's ``error_code``), else None: a
    # stream tells the client it is its error to fix, as a held request's 400 does.
    code: str | None = None


class Segment(BaseModel):
    seq: int
    deltas: list[Delta] = Field(default_factory=list)
    completion_tokens: int | None = None
    end: End | None = None

    @property
    def empty(self) -> bool:
        """Neither text nor an end: a reader's keep-alive (``follow``), never written."""
        return not self.deltas and self.end is None and self.completion_tokens is None

    @property
    def attempt(self) -> int:
        return self.seq // SEQ_PER_ATTEMPT

    def to_item(self, job_id: str, now_s: float | None = None, tenant: str | None = None) -> dict[str, Any]:
        body = self.model_dump_json(exclude={"seq"}, exclude_defaults=True)
        expires = int(now_s if now_s is not None else time.time()) + RETENTION_S
        return {
            PARTITION_KEY: {"S": job_id},
            SORT_KEY: {"N": str(self.seq)},
            BODY_ATTRIBUTE: {"S": body},
            TTL_ATTRIBUTE: {"N": str(expires)},
            **({TENANT_ATTRIBUTE: {"S": tenant}} if tenant else {}),
        }

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Segment:
        """The segment in an item as DynamoDB returns it (a Query's, or a stream record's ``NewImage``)."""
        return cls.model_validate({**json.loads(item[BODY_ATTRIBUTE]["S"]), "seq": int(item[SORT_KEY]["N"])})


class EventLog:
    """The log table (``JOB_STREAM_TABLE_NAME``): the worker appends, any API instance reads."""

    def __init__(self, table_name: str, dynamodb: Any | None = None) -> None:
        self.table_name = table_name
        self._dynamodb = dynamodb or client("dynamodb")

    def append(self, job_id: str, segment: Segment, tenant: str | None = None) -> None:
        """Write one segment (PutItem), with the job's ``tenant`` for the WebSocket push. Written once per ``seq``: a
        repeated write of the same segment is harmless."""
        self._dynamodb.put_item(TableName=self.table_name, Item=segment.to_item(job_id, tenant=tenant))

    def after(self, job_id: str, seq: int = -1, *, limit: int = 100, tenant: str | None = None) -> list[Segment]:
        """Segments with a ``seq`` above ``seq``, oldest first (one strongly consistent Query, at most ``limit``);
        with ``tenant``, only segments written for that tenant (another tenant's job reads as one with no log)."""
        names = {"#pk": PARTITION_KEY, "#seq": SORT_KEY}
        values: dict[str, Any] = {":job": {"S": job_id}, ":seq": {"N": str(seq)}}
        only: dict[str, Any] = {}
        if tenant is not None:
            names["#tenant"] = TENANT_ATTRIBUTE
            values[":tenant"] = {"S": tenant}
            only["FilterExpression"] = "#tenant = :tenant"
        response = self._dynamodb.query(
            TableName=self.table_name,
            KeyConditionExpression="#pk = :job AND #seq > :seq",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ConsistentRead=True,
            Limit=limit,
            **only,
        )
        return [Segment.from_item(item) for item in response.get("Items", [])]
