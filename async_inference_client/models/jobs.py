"""Jobs as the API shows them: their states, ``GET /v1/jobs/{id}``'s view, a page of them, the API's error body, and
the WebSocket API's subscription and events."""

from __future__ import annotations

import datetime as dt
import enum
import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, model_validator

from async_inference_client.limits import WS_MAX_JOB_IDS_PER_SUBSCRIBE
from async_inference_client.models.base import SCHEMA_VERSION, StrictModel, TolerantModel
from async_inference_client.models.chat import Usage

JOB_ID_PATTERN = r"^job_[0-9a-f]{32}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)


def is_job_id(value: str) -> bool:
    return bool(_JOB_ID_RE.match(value))


class JobStatus(str, enum.Enum):
    AWAITING_UPLOAD = "awaiting_upload"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_final(self) -> bool:
        """No state follows this one: the job has ended (its result, error or reason is all there will be)."""
        return self in FINAL_STATES


FINAL_STATES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED})

JobPriority = Literal["interactive", "batch"]


class WebhookAttempt(TolerantModel):
    """One delivery of a webhook: when, which event, the receiver's answer or the error, and which receive of the
    delivery's queue message it was (the DLQ takes the message after settings.WEBHOOK_MAX_RECEIVE_COUNT)."""

    at: dt.datetime
    event: str | None = None  # "completed" or "started"
    receive_count: int | None = None
    status_code: int | None = None
    error: str | None = None


class WebhookState(TolerantModel):
    url: str
    events: list[str]
    status: Literal["pending", "delivered", "failed"] = "pending"
    attempts: list[WebhookAttempt] = Field(default_factory=list)


class JobProgress(TolerantModel):
    """How far a running job has got: the tokens it has generated so far, as of ``updated_at``. There is no total to
    divide by: ``max_tokens`` is only a cap, and most jobs stop before it."""

    completion_tokens: int = Field(ge=0)
    updated_at: dt.datetime


class PresignedUrl(BaseModel):
    url: str
    expires_at: dt.datetime


class PresignedUpload(PresignedUrl):
    method: Literal["PUT"] = "PUT"
    headers: dict[str, str] = Field(description="Send exactly these headers with the PUT.")


class JobView(BaseModel):
    """What ``GET /v1/jobs/{id}`` returns."""

    job_id: str
    status: JobStatus
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    attempts: int = 0
    model: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    error: str | None = None
    error_code: str | None = Field(
        default=None,
        description="A failed job's OpenAI error code when the failure is the request's (context_length_exceeded, "
        "invalid_request): fix the request rather than retry it. None for the service's own failures.",
    )
    usage: Usage | None = None
    result: PresignedUrl | None = None
    result_expires_at: dt.datetime | None = Field(
        default=None, description="When the result is deleted; a GET after that is 410 Gone."
    )
    upload: PresignedUpload | None = None
    webhook: WebhookState | None = None
    progress: JobProgress | None = Field(default=None, description="While the job runs: its tokens generated so far.")
    priority: JobPriority = Field(default="interactive", description="The lane the job was queued in.")


class JobList(BaseModel):
    jobs: list[JobView]
    next: str | None = Field(default=None, description="Pass as ?next= to get the following page.")


class ErrorDetail(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    code: str
    message: str
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    error: ErrorBody


# --- The WebSocket API: what a client sends to be told, and what it is told -----------------------------------------


class Subscription(StrictModel):
    """What a WebSocket client sends to be told about jobs: exactly one of ``job_ids``, ``batch_id`` or ``all``; with
    one job id, ``starting_after`` (0, or the ``seq`` of the last ``job.delta`` the client has) also asks for the
    streamed job's deltas written since, in the reply (a dropped connection resumed)."""

    action: Literal["subscribe"] = "subscribe"
    job_ids: list[Annotated[str, StringConstraints(pattern=JOB_ID_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=WS_MAX_JOB_IDS_PER_SUBSCRIBE
    )
    batch_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    all: Literal[True] | None = None
    starting_after: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _exactly_one_scope(self) -> Subscription:
        if sum(scope is not None for scope in (self.job_ids, self.batch_id, self.all)) != 1:
            raise ValueError("give exactly one of 'job_ids', 'batch_id' or 'all': true")
        if self.starting_after is not None and len(self.job_ids or ()) != 1:
            raise ValueError("'starting_after' resumes one job's deltas: give it with 'job_ids' of exactly one id")
        return self


JobEventType = Literal["job.started", "job.progress", "job.completed", "job.failed", "job.cancelled", "job.expired"]

# The state a job is in once an event of each type is sent. "job.completed" is the successful end.
EVENT_STATUS: dict[str, JobStatus] = {
    "job.started": JobStatus.RUNNING,
    "job.progress": JobStatus.RUNNING,
    "job.completed": JobStatus.SUCCEEDED,
    "job.failed": JobStatus.FAILED,
    "job.cancelled": JobStatus.CANCELLED,
    "job.expired": JobStatus.EXPIRED,
}


class JobEvent(TolerantModel):
    """A message the WebSocket API pushes to a subscriber: a job started, made progress, or reached a final state.

    An event says that something happened, not everything about the job: the result URL and the usage come from
    ``GET /v1/jobs/{id}``. Fields other than these are tolerated, so that a newer server does not break a client.
    """

    schema_version: Literal["1"] = SCHEMA_VERSION
    type: JobEventType
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    progress: JobProgress | None = Field(default=None, description="job.started and job.progress: tokens so far.")
    error: str | None = None

    @property
    def status(self) -> JobStatus:
        return EVENT_STATUS[self.type]
