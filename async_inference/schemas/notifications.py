"""What subscribers are told: the result notification a job's end publishes, the activity of a running job, and the
messages the WebSocket API pushes."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, Field, field_serializer

from async_inference import settings
from async_inference.jobs import JOB_ID_PATTERN, JobStatus
from async_inference_client.models.base import SCHEMA_VERSION, TolerantModel
from async_inference_client.models.chat import ChatCompletion, Usage
from async_inference_client.models.embeddings import EmbeddingList
from async_inference_client.models.jobs import JobEventType, JobProgress


class S3Location(BaseModel):
    bucket: str
    key: str


class Timings(BaseModel):
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    queue_s: float | None = None
    run_s: float | None = None


class ResultNotification(TolerantModel):
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
    result: ChatCompletion | EmbeddingList | None = Field(
        default=None, description=f"The result itself when it is at most {settings.MAX_INLINE_RESULT_BYTES} bytes."
    )
    usage: Usage | None = None
    error: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    timings: Timings

    @field_serializer("result")
    def _result_as_stored(self, result: ChatCompletion | EmbeddingList | None) -> dict[str, Any] | None:
        # The inline result is the stored object, nulls included (``"refusal": null``, ``"logprobs": null`` as OpenAI
        # writes them), though the notification itself is published without its unset fields (exclude_none).
        return None if result is None else result.model_dump(mode="json")


# --- The WebSocket API: what a client sends to be told, and what it is told -----------------------------------------


class BatchEvent(TolerantModel):
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


class JobActivity(TolerantModel):
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
