"""The Files and Batches APIs' wire objects, copied field for field from openai-python's ``types/file_object.py``,
``file_deleted.py``, ``batch.py``, ``batch_error.py``, ``batch_request_counts.py`` and ``model.py`` (so the official
SDK parses them unmodified), and the presigned-upload extension's answer."""

from __future__ import annotations

import enum
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

FILE_ID_PATTERN = r"^file-[0-9a-f]{24}$"
BATCH_ID_PATTERN = r"^batch_[0-9a-f]{32}$"


class BatchStatus(str, enum.Enum):
    """OpenAI's batch states."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in FINAL_BATCH_STATES


FINAL_BATCH_STATES = frozenset({BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})

FilePurpose = Literal[
    "assistants", "assistants_output", "batch", "batch_output", "fine-tune", "fine-tune-results", "vision", "user_data"
]


class FileObject(BaseModel):
    id: str
    bytes: int
    created_at: int
    filename: str
    object: Literal["file"] = "file"
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"]
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    deleted: bool
    object: Literal["file"] = "file"


class BatchError(BaseModel):
    code: str | None = None
    line: int | None = None
    message: str | None = None
    param: str | None = None


class Errors(BaseModel):
    data: list[BatchError] | None = None
    object: str | None = "list"


class BatchRequestCounts(BaseModel):
    completed: int
    failed: int
    total: int


class Batch(BaseModel):
    id: str
    completion_window: str
    created_at: int
    endpoint: str
    input_file_id: str
    object: Literal["batch"] = "batch"
    status: BatchStatus
    cancelled_at: int | None = None
    cancelling_at: int | None = None
    completed_at: int | None = None
    error_file_id: str | None = None
    errors: Errors | None = None
    expired_at: int | None = None
    expires_at: int | None = None
    failed_at: int | None = None
    finalizing_at: int | None = None
    in_progress_at: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    output_file_id: str | None = None
    request_counts: BatchRequestCounts | None = None


class ModelCapacity(BaseModel):
    """Why the model's workers do not run (this service's addition to OpenAI's Model): its GPU instances' latest
    launch failed, with EC2's reason (a vCPU quota, no capacity in the zones). Its jobs stay queued meanwhile."""

    state: Literal["launch_failed"]
    reason: str
    since: int | None = None  # when the failed launch started, in seconds since the epoch


class Model(BaseModel):
    id: str
    created: int
    object: Literal["model"] = "model"
    owned_by: str
    capacity: ModelCapacity | None = None  # set only while the model's GPU launches fail


_Item = TypeVar("_Item", bound=BaseModel)


class Page(BaseModel, Generic[_Item]):
    """OpenAI's cursor page: pass ``last_id`` as ``after`` for the next one while ``has_more``."""

    object: Literal["list"] = "list"
    data: list[_Item]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class PresignedFileUpload(BaseModel):
    """Where to PUT a file's bytes (the presigned-upload extension), and until when."""

    url: str
    method: Literal["PUT"] = "PUT"
    headers: dict[str, str]
    expires_at: int


class FileUpload(FileObject):
    """``POST /v1/files/uploads``' answer: the file, and the presigned PUT for its bytes."""

    upload: PresignedFileUpload
