"""What travels on the queues: a claim check per job (never the prompt), a chunk of a batch's input, a step of the
batch controller, the end of an upload window. Each carries ``schema_version``."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field

from async_inference.jobs import JOB_ID_PATTERN
from async_inference_client.models.base import SCHEMA_VERSION, TolerantModel


class ClaimCheck(TolerantModel):
    """A reference to a job's payload in S3. Never the prompt: it stays well under 1 KB."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    tenant: str
    bucket: str
    key: str
    model: str | None = None  # lets a fleet route by model without reading the payload
    deadline: dt.datetime  # still queued after this: the job expires and never runs
    timeout_s: int  # a running generation is aborted after this
    # The engine rows the request takes (its n), so that a worker's tenant share counts rows before it reads the
    # payload (gpu_worker.fairness). A claim check written before it existed reads as one row.
    rows: int = Field(1, ge=1)


class EmbeddingClaimCheck(ClaimCheck):
    """A job whose payload is an embeddings request (``JobSubmission.endpoint`` ``/v1/embeddings``): its own kind,
    so that the worker parses the payload as one (gpu_worker.claims)."""

    kind: Literal["embedding"] = "embedding"


class ChunkClaimCheck(TolerantModel):
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


class BatchControl(TolerantModel):
    """A step of a batch for the batch controller: plan it (validate and chunk its input), or finalize it."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    kind: Literal["plan", "finalize"]
    batch_id: str
    tenant: str


class UploadDeadline(TolerantModel):
    """The scheduled end of an upload job's presign window: its job expires then if the upload has not arrived."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID_PATTERN)
