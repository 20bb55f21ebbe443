"""Per-tenant quotas checked at submit, so one tenant cannot fill the queues and the storage every tenant shares.

``max_active_jobs``: the tenant's unfinished jobs (awaiting their upload, queued or running). Counted on the job
table's sparse index of unfinished jobs (``settings.ACTIVE_JOBS_INDEX_NAME``): a job enters it when it is created and
leaves it in the same conditional write that makes it final, so the count never drifts, whatever fails in between
(no counter to decrement, nothing to reconcile). The index is eventually consistent (typically well under a second):
submits that race within that lag may all pass, so the bound is ``max_active_jobs`` plus the tenant's submits within
the lag, at most its usage plan's ``burst_limit``.

``max_batch_lines_in_flight``: the lines of the tenant's batches not yet final (validating, in progress, finalizing,
cancelling), counted the same way on the batch table's sparse index of batches in flight
(``settings.BATCH_ACTIVE_INDEX_NAME``), which carries each batch's line count once it is planned. Checked twice: at
``POST /v1/batches`` (a 429 when the tenant's batches in flight already hold the limit), and when the controller has
counted the new batch's lines (the batch fails, its error naming the limit, when they would take the tenant past it).

``max_stored_bytes``: the bytes of the tenant's files (uploaded ones, as announced, and the output and error files of
its batches), read from the file records through the owner index. Checked at ``POST /v1/files`` and
``POST /v1/files/uploads``; deleting a file, or its expiry, gives its bytes back.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from async_inference import settings
from async_inference.limits import LimitOverrides


class TenantQuota(BaseModel):
    """One tenant's quotas (the ``tenants`` context sets them per tenant; docs/security.md lists the defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_active_jobs: int = Field(settings.DEFAULT_MAX_ACTIVE_JOBS, ge=1)
    max_batch_lines_in_flight: int = Field(settings.DEFAULT_MAX_BATCH_LINES_IN_FLIGHT, ge=1)
    max_stored_bytes: int = Field(settings.DEFAULT_MAX_STORED_BYTES, ge=1)
    # The plan's changes to the deployment's bounds on one request's cost (async_inference.limits; None: none).
    request_limits: LimitOverrides | None = None


def quota_exceeded_message(tenant: str, limit: int) -> str:
    return (
        f"max_active_jobs: tenant {tenant} has {limit} jobs awaiting upload, queued or running, its limit; submit "
        "again once some have finished"
    )


def batch_lines_message(tenant: str, limit: int, in_flight: int, adding: int | None = None) -> str:
    """Why a batch is refused (``adding`` None: at creation, the lines in flight are at the limit already) or failed
    (``adding``: its lines would take the tenant past the limit)."""
    held = f"tenant {tenant} has {in_flight} batch lines in flight (batches not yet final)"
    if adding is None:
        return f"max_batch_lines_in_flight: {held}, its limit is {limit}; create the batch once some have finished"
    return (
        f"max_batch_lines_in_flight: {held}; this batch's {adding} lines would pass its limit of {limit}; create it "
        "again once some have finished, or in smaller batches"
    )


def stored_bytes_message(tenant: str, limit: int, stored: int, adding: int) -> str:
    return (
        f"max_stored_bytes: tenant {tenant} stores {stored} bytes in files; {adding} more would pass its limit of "
        f"{limit}; delete files it no longer needs"
    )
