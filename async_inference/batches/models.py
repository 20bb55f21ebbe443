"""The Files and Batches APIs' request bodies and the records the batch table holds. The wire objects (openai-python's
types, so the official SDK parses them unmodified) are the client package's, imported here.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints

from async_inference import settings
from async_inference.endpoints import BatchEndpoint
from async_inference.schemas import SCHEMA_VERSION, MetadataKey, MetadataValue, StrictModel, TolerantModel, WebhookState
from async_inference_client.models.batches import (  # noqa: F401 (re-exported for the service)
    BATCH_ID_PATTERN,
    FILE_ID_PATTERN,
    FINAL_BATCH_STATES,
    Batch,
    BatchError,
    BatchRequestCounts,
    BatchStatus,
    Errors,
    FileDeleted,
    FileObject,
    FilePurpose,
    FileUpload,
    Model,
    ModelList,
    Page,
    PresignedFileUpload,
)


def new_file_id(seed: str | None = None) -> str:
    """A fresh file id, or the one ``seed`` always maps to (a batch's output and error files: a finalize that runs
    twice writes the same files)."""
    digits = uuid.uuid5(uuid.NAMESPACE_URL, seed).hex if seed else uuid.uuid4().hex
    return f"file-{digits[:24]}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def epoch(moment: dt.datetime) -> int:
    return int(moment.timestamp())


# target -> the states a batch may enter it from (every state write is conditional on these).
BATCH_SOURCES: dict[BatchStatus, frozenset[BatchStatus]] = {
    BatchStatus.FAILED: frozenset({BatchStatus.VALIDATING}),
    BatchStatus.IN_PROGRESS: frozenset({BatchStatus.VALIDATING}),
    BatchStatus.CANCELLING: frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS}),
    BatchStatus.FINALIZING: frozenset(
        {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING}
    ),
    BatchStatus.COMPLETED: frozenset({BatchStatus.FINALIZING}),
    BatchStatus.EXPIRED: frozenset({BatchStatus.FINALIZING}),
    BatchStatus.CANCELLED: frozenset({BatchStatus.FINALIZING}),
}
# Webhook event names, as OpenAI's webhooks name them (openai-python types/webhooks/batch_*_webhook_event.py).
BATCH_EVENTS = {
    BatchStatus.COMPLETED: "batch.completed",
    BatchStatus.FAILED: "batch.failed",
    BatchStatus.EXPIRED: "batch.expired",
    BatchStatus.CANCELLED: "batch.cancelled",
}


# --- Request bodies -------------------------------------------------------------------------------------------------


BatchEvent = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


class BatchWebhookSpec(StrictModel):
    """A batch's webhook (an extension: the SDK sends it as ``extra_body={"webhook": {...}}``): the batch's end is
    POSTed there as OpenAI's webhook event, signed as job webhooks are (Standard Webhooks, the tenant's secret)."""

    url: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    events: list[BatchEvent] = Field(
        default_factory=lambda: list(BATCH_EVENTS.values()),
        min_length=1,
        description="The events to deliver. Default: all four.",
    )


class BatchCreate(StrictModel):
    """Body of ``POST /v1/batches`` (openai-python's BatchCreateParams, less output_expires_after), and ``webhook``."""

    input_file_id: Annotated[str, StringConstraints(pattern=FILE_ID_PATTERN)]
    endpoint: BatchEndpoint  # async_inference.endpoints: the endpoints a batch may run
    completion_window: Literal["24h"]
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=settings.MAX_METADATA_KEYS)
    webhook: BatchWebhookSpec | None = None


class FileUploadRequest(StrictModel):
    """Body of ``POST /v1/files/uploads``: a file too large to send through ``POST /v1/files``."""

    filename: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    purpose: Literal["batch"]
    bytes: int = Field(ge=1, le=settings.BATCH_MAX_FILE_BYTES, description="Exact size of the file you will PUT.")


# --- Records (the batch table) --------------------------------------------------------------------------------------


class _Record(TolerantModel):
    schema_version: Literal["1"] = SCHEMA_VERSION
    id: str
    tenant: str
    created_at: dt.datetime


class FileRecord(_Record):
    kind: Literal["file"] = "file"
    bytes: int
    filename: str
    purpose: FilePurpose
    key: str  # its object in the claim-check bucket
    expires_at: dt.datetime
    upload_expires_at: dt.datetime | None = None  # set while a presigned upload has not been confirmed

    @property
    def awaiting_upload(self) -> bool:
        return self.upload_expires_at is not None

    def wire(self) -> FileObject:
        details = None
        if self.awaiting_upload:
            assert self.upload_expires_at is not None
            details = f"awaiting its upload: PUT the bytes to the presigned URL before {self.upload_expires_at:%Y-%m-%dT%H:%M:%SZ}"
        return FileObject(
            id=self.id,
            bytes=self.bytes,
            created_at=epoch(self.created_at),
            filename=self.filename,
            purpose=self.purpose,
            status="uploaded" if self.awaiting_upload else "processed",
            expires_at=epoch(self.expires_at),
            status_details=details,
        )


class ChunkRange(BaseModel):
    """One chunk of a planned batch: the byte range of its lines in the input file."""

    start_byte: int
    end_byte: int
    first_line: int
    line_count: int


class BatchRecord(_Record):
    kind: Literal["batch"] = "batch"
    status: BatchStatus
    endpoint: str
    input_file_id: str
    input_key: str
    completion_window: str
    deadline: dt.datetime  # completion_window after creation
    metadata: dict[str, str] | None = None
    model: str | None = None
    errors: list[BatchError] = Field(default_factory=list)
    total: int = 0
    completed: int = 0
    failed: int = 0
    chunk_count: int | None = None  # set by planning
    chunks: list[ChunkRange] = Field(default_factory=list)
    counted_chunks: set[int] = Field(default_factory=set)
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: dt.datetime | None = None
    finalizing_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    failed_at: dt.datetime | None = None
    expired_at: dt.datetime | None = None
    cancelling_at: dt.datetime | None = None
    cancelled_at: dt.datetime | None = None
    notified: bool = False
    webhook: WebhookState | None = None  # its URL, events, delivery status and attempts

    @property
    def planned(self) -> bool:
        return self.chunk_count is not None

    @property
    def all_counted(self) -> bool:
        return self.chunk_count is not None and len(self.counted_chunks) >= self.chunk_count

    def wire(self) -> Batch:
        def at(moment: dt.datetime | None) -> int | None:
            return epoch(moment) if moment else None

        return Batch(
            id=self.id,
            completion_window=self.completion_window,
            created_at=epoch(self.created_at),
            endpoint=self.endpoint,
            input_file_id=self.input_file_id,
            status=self.status,
            cancelled_at=at(self.cancelled_at),
            cancelling_at=at(self.cancelling_at),
            completed_at=at(self.completed_at),
            error_file_id=self.error_file_id,
            errors=Errors(data=self.errors) if self.errors else None,
            expired_at=at(self.expired_at),
            expires_at=epoch(self.deadline),
            failed_at=at(self.failed_at),
            finalizing_at=at(self.finalizing_at),
            in_progress_at=at(self.in_progress_at),
            metadata=self.metadata,
            model=self.model,
            output_file_id=self.output_file_id,
            request_counts=BatchRequestCounts(completed=self.completed, failed=self.failed, total=self.total),
        )


class BatchNotification(BaseModel):
    """What the result topic carries when a batch ends: OpenAI's webhook event (``id``, ``object``, ``type``,
    ``created_at``, ``data.id``) with the batch itself and its tenant, so a subscriber needs no second call."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    id: str
    object: Literal["event"] = "event"
    type: Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
    created_at: int
    data: dict[str, str]  # {"id": "<batch id>"}
    tenant: str
    batch: Batch

    def event(self) -> BatchWebhookEvent:
        """The event as a batch's webhook delivers it: OpenAI's webhook event, nothing more."""
        return BatchWebhookEvent(id=self.id, type=self.type, created_at=self.created_at, data=self.data)


class BatchWebhookEvent(BaseModel):
    """A batch webhook's body, as OpenAI's webhooks send it (openai-python types/webhooks/batch_*_webhook_event.py)."""

    id: str
    object: Literal["event"] = "event"
    type: BatchEvent
    created_at: int
    data: dict[str, str]  # {"id": "<batch id>"}
