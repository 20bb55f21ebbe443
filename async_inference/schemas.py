"""The wire schemas: what clients send, what travels on the queue, what is stored and what subscribers receive.

Every producer and consumer validates with these models. Each message that leaves a process carries
``schema_version`` so that a consumer can tell an old message from a new one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from async_inference import settings
from async_inference.jobs import JOB_ID_PATTERN, JobStatus

# The wire objects a client reads are defined in the client package and imported here: the API answers with the very
# models the SDK parses. What only the service validates or stores (requests, claim checks, records) is defined below.
from async_inference_client.models.base import SCHEMA_VERSION, StrictModel, TolerantModel
from async_inference_client.models.chat import AssistantMessage, ChatCompletion, Choice, Usage  # noqa: F401
from async_inference_client.models.jobs import (  # noqa: F401 (re-exported: the service imports them from here)
    EVENT_STATUS,
    ErrorBody,
    ErrorDetail,
    ErrorResponse,
    JobEvent,
    JobEventType,
    JobList,
    JobPriority,
    JobProgress,
    JobView,
    PresignedUpload,
    PresignedUrl,
    Subscription,
    WebhookAttempt,
    WebhookState,
)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


_Strict = StrictModel  # client input
_Internal = TolerantModel  # messages between our own components


# --- The request: an OpenAI-compatible chat.completions body ------------------------------------------------------


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)]
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None


StopSequence = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class ChatCompletionRequest(_Strict):
    """The subset of ``POST /v1/chat/completions`` that a batch job can use. ``n`` is fixed at 1."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    messages: list[ChatMessage] = Field(min_length=1, max_length=settings.MAX_MESSAGES)
    max_tokens: int = Field(default=settings.DEFAULT_MAX_TOKENS, ge=1, le=settings.MAX_TOKENS_LIMIT)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: StopSequence | list[StopSequence] | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: Literal[1] = 1

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > settings.MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {settings.MAX_STOP_SEQUENCES} stop sequences are allowed")
        return value

    @property
    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


# --- Submission -----------------------------------------------------------------------------------------------------

MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=settings.MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, StringConstraints(max_length=settings.MAX_METADATA_VALUE_CHARS)]


class UploadSpec(_Strict):
    size_bytes: int = Field(ge=1, le=settings.MAX_UPLOAD_BYTES, description="Exact size of the body you will PUT.")


class WebhookSpec(_Strict):
    url: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    events: list[Literal["completed", "started"]] = Field(default_factory=lambda: ["completed"], min_length=1)


class JobSubmission(_Strict):
    """Body of ``POST /v1/jobs``: exactly one of ``request`` (inline) or ``upload`` (presigned PUT)."""

    # The JSON Schema (and so the OpenAPI document) says "exactly one" as the validator below enforces it.
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["request"]}, {"required": ["upload"]}]})

    request: ChatCompletionRequest | None = None
    upload: UploadSpec | None = None
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=settings.MAX_METADATA_KEYS)
    webhook: WebhookSpec | None = None
    ttl_seconds: int | None = Field(default=None, ge=1, le=settings.MAX_TTL_S)
    timeout_seconds: int | None = Field(default=None, ge=1, le=settings.MAX_EXECUTION_TIMEOUT_S)
    priority: JobPriority = Field(
        default="interactive",
        description='"interactive": the job queue, served first. "batch": the batch lane, beside batch chunks: the job '
        "runs in engine slots interactive jobs leave free, and is preempted (run again from the start) when an "
        "interactive job needs its slot. Its states, result and notifications are those of any job.",
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> JobSubmission:
        if (self.request is None) == (self.upload is None):
            raise ValueError("give exactly one of 'request' (the chat.completions body) or 'upload' ({'size_bytes': N})")
        return self

    def fingerprint(self) -> str:
        """A digest of what the submission asks for, defaults filled in: two submissions that would make the same
        job have the same fingerprint, whatever their key order, spacing or omitted defaults."""
        fields = self.model_dump(mode="json")
        if fields["priority"] == "interactive":
            # Left out at its default, so jobs fingerprinted before priority existed still match their retries.
            del fields["priority"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


# --- The claim check: the only thing on the queue -------------------------------------------------------------------


class ClaimCheck(_Internal):
    """A reference to a job's payload in S3. Never the prompt: it stays well under 1 KB."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    tenant: str
    bucket: str
    key: str
    model: str | None = None  # lets a fleet route by model without reading the payload
    deadline: dt.datetime  # still queued after this: the job expires and never runs
    timeout_s: int  # a running generation is aborted after this


class ChunkClaimCheck(_Internal):
    """A range of lines of a batch's input file, on the batch-lane queue (docs/design/batches.md). Never the lines."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    kind: Literal["batch_chunk"] = "batch_chunk"
    batch_id: str
    tenant: str
    bucket: str
    input_key: str  # the input file's object
    chunk: int = Field(ge=0)
    start_byte: int = Field(ge=0)  # first byte of the chunk's first line
    end_byte: int = Field(ge=0)  # last byte of the chunk's last line (inclusive, as an HTTP Range)
    first_line: int = Field(ge=1)  # line number of the first line in the input file (errors name lines)
    line_count: int = Field(ge=1)
    model: str | None = None
    deadline: dt.datetime  # the batch's completion window ends: lines not finished by then are batch_expired
    timeout_s: int  # one line's generation is aborted after this


class BatchControl(_Internal):
    """A step of a batch for the batch controller: plan it (validate and chunk its input), or finalize it."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    kind: Literal["plan", "finalize"]
    batch_id: str
    tenant: str


class BatchLineError(BaseModel):
    code: str
    message: str


class BatchLineResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchLineOutput(BaseModel):
    """One line of a batch's output or error file, in OpenAI's format."""

    id: str  # batch_req_...
    custom_id: str
    response: BatchLineResponse | None = None
    error: BatchLineError | None = None


class UploadDeadline(_Internal):
    """The scheduled end of an upload job's presign window: its job expires then if the upload has not arrived."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID_PATTERN)


# --- The stored job -------------------------------------------------------------------------------------------------


class Job(_Internal):
    """A job as the state store holds it."""

    job_id: str
    tenant: str
    status: JobStatus
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    attempts: int = 0
    model: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    error: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    request_bucket: str
    request_key: str
    result_key: str | None = None
    # When the bucket's lifecycle may delete the result (settings.lifecycle_expiry of its write); set with the result.
    result_expires_at: dt.datetime | None = None
    upload_size_bytes: int | None = None
    deadline: dt.datetime
    timeout_s: int
    idempotency_key: str | None = None
    # JobSubmission.fingerprint() of the request that created the job: a retry with its Idempotency-Key must match.
    request_fingerprint: str | None = None
    webhook: WebhookState | None = None
    notified: bool = False
    progress: JobProgress | None = None  # written while the job runs (gpu_worker.progress)
    priority: JobPriority = "interactive"  # "batch": its claim check goes to the batch-lane queue

    @property
    def upload_window_ends_at(self) -> dt.datetime:
        """When the presigned upload of an upload job stops working: PRESIGNED_UPLOAD_EXPIRY_S after creation, or the
        job's deadline if that comes first. Every URL for the job (an idempotent retry presigns anew) ends then."""
        return min(self.created_at + dt.timedelta(seconds=settings.PRESIGNED_UPLOAD_EXPIRY_S), self.deadline)

    def claim_check(self) -> ClaimCheck:
        return ClaimCheck(
            job_id=self.job_id,
            tenant=self.tenant,
            bucket=self.request_bucket,
            key=self.request_key,
            model=self.model,
            deadline=self.deadline,
            timeout_s=self.timeout_s,
        )


# --- The notification -----------------------------------------------------------------------------------------------


class S3Location(BaseModel):
    bucket: str
    key: str


class Timings(BaseModel):
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    queue_s: float | None = None
    run_s: float | None = None


class ResultNotification(_Internal):
    """The message published to the result topic when a job reaches a final state.

    Message attributes ``status``, ``tenant`` and ``model`` carry the same values so that subscriptions can filter.
    """

    schema_version: Literal["1"] = SCHEMA_VERSION
    event: Literal["job.completed"] = "job.completed"
    job_id: str
    tenant: str
    status: JobStatus
    model: str | None = None
    result_location: S3Location | None = None
    result: ChatCompletion | None = Field(
        default=None, description=f"The result itself when it is at most {settings.MAX_INLINE_RESULT_BYTES} bytes."
    )
    usage: Usage | None = None
    error: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    timings: Timings


# --- The WebSocket API: what a client sends to be told, and what it is told -----------------------------------------


class BatchEvent(_Internal):
    """A message the WebSocket API pushes to a connection that follows a batch (or all of its tenant's work): the
    batch ended. Its output and error files come from ``GET /v1/batches/{id}``."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    type: Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
    batch_id: str
    status: str
    request_counts: dict[str, int] | None = None  # total, completed, failed


# The event type that tells a job's final status; the result notification's own ``event`` is "job.completed" for
# every final status (as the per-job webhook names it), a pushed event says which end it was.
FINAL_EVENT_TYPES: dict[JobStatus, JobEventType] = {
    JobStatus.SUCCEEDED: "job.completed",
    JobStatus.FAILED: "job.failed",
    JobStatus.CANCELLED: "job.cancelled",
    JobStatus.EXPIRED: "job.expired",
}


class JobActivity(_Internal):
    """What a worker publishes to the job event topic while a job runs: it entered the engine (``job.started``), or it
    generated more tokens (``job.progress``, at most once per progress interval). Message attributes ``event`` and
    ``tenant`` carry the same values. The final events come from the result topic's ``ResultNotification``."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    event: Literal["job.started", "job.progress"]
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    tenant: str
    model: str | None = None
    started_at: dt.datetime | None = None
    progress: JobProgress | None = None
