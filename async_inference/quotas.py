"""Per-tenant quotas checked at submit, so one tenant cannot fill the queues every tenant shares.

``max_active_jobs``: the tenant's unfinished jobs (awaiting their upload, queued or running). Counted on the job
table's sparse index of unfinished jobs (``settings.ACTIVE_JOBS_INDEX_NAME``): a job enters it when it is created and
leaves it in the same conditional write that makes it final, so the count never drifts, whatever fails in between
(no counter to decrement, nothing to reconcile). The index is eventually consistent (typically well under a second):
submits that race within that lag may all pass, so the bound is ``max_active_jobs`` plus the tenant's submits within
the lag, at most its usage plan's ``burst_limit``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from async_inference import settings


class TenantQuota(BaseModel):
    """One tenant's quotas (the ``tenants`` context sets them per tenant; docs/security.md lists the defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_active_jobs: int = Field(settings.DEFAULT_MAX_ACTIVE_JOBS, ge=1)


def quota_exceeded_message(tenant: str, limit: int) -> str:
    return (
        f"max_active_jobs: tenant {tenant} has {limit} jobs awaiting upload, queued or running, its limit; submit "
        "again once some have finished"
    )
