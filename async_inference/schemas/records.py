"""What is stored: a job as the state store holds it, and a line of a batch's output or error file."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

from async_inference import settings
from async_inference.jobs import JobStatus
from async_inference.schemas.embeddings import EMBEDDINGS_ENDPOINT
from async_inference.schemas.queue import ClaimCheck, EmbeddingClaimCheck
from async_inference_client.models.base import TolerantModel
from async_inference_client.models.chat import Usage
from async_inference_client.models.jobs import JobPriority, JobProgress, WebhookState


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Job(TolerantModel):
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
    # The OpenAI error code of a failure that is the request's fault (``context_length_exceeded``): a client error, not
    # to be retried; None for any other failure (``server_error``).
    error_code: str | None = None
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
    # When the upload intake sent an upload job's one claim check (UploadIntake.accept_upload); unset between its
    # acceptance and the send, so a redelivered event can tell an interrupted acceptance from a replayed PUT.
    claim_sent_at: dt.datetime | None = None
    # The worker running the job, and until when (epoch milliseconds) its hold stands: renewed with the visibility of
    # the job's message, so no other worker starts the job until the holder's visibility has run out (jobs.py).
    lease_owner: str | None = None
    lease_expires_ms: int | None = None
    endpoint: str | None = None  # JobSubmission.endpoint when not chat.completions (its claim check's kind says it)
    rows: int = 1  # engine_rows of its request, carried by its claim check; set when the request is known

    @property
    def upload_window_ends_at(self) -> dt.datetime:
        """When the presigned upload of an upload job stops working: PRESIGNED_UPLOAD_EXPIRY_S after creation, or the
        job's deadline if that comes first. Every URL for the job (an idempotent retry presigns anew) ends then."""
        return min(self.created_at + dt.timedelta(seconds=settings.PRESIGNED_UPLOAD_EXPIRY_S), self.deadline)

    def claim_check(self) -> ClaimCheck:
        kind = EmbeddingClaimCheck if self.endpoint == EMBEDDINGS_ENDPOINT else ClaimCheck
        return kind(
            job_id=self.job_id,
            tenant=self.tenant,
            bucket=self.request_bucket,
            key=self.request_key,
            model=self.model,
            deadline=self.deadline,
            timeout_s=self.timeout_s,
            rows=self.rows,
        )


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
