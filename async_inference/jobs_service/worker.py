"""The worker's side of a job: reading it and its request, starting it under a lease, recording its progress.

The worker ends jobs through ``JobOutcomes`` (async_inference.jobs_service.outcomes), as every other side does.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from async_inference import settings
from async_inference.aws import Blobs, JobStore, PayloadTooLarge
from async_inference.jobs import JobStatus
from async_inference.schemas import ClaimCheck, Job


class WorkerJobs:
    """What a GPU worker reads and writes of the jobs it runs, whoever's they are."""

    def __init__(self, *, store: JobStore, blobs: Blobs) -> None:
        self.store = store
        self.blobs = blobs

    def lookup(self, job_id: str) -> Job | None:
        """A job as it stands, whoever's it is (the worker's read; the API reads through ``JobApi.get``)."""
        return self.store.get(job_id)

    def lookup_many(self, job_ids: list[str]) -> dict[str, Job]:
        """Up to 100 jobs as they stand, in one request (the worker's cancellation check)."""
        return self.store.get_many(job_ids)

    def read_request(self, claim: ClaimCheck) -> bytes | None:
        """A claim check's request body; None when it is missing or over the size limit (the job can never run)."""
        try:
            return self.blobs.get(claim.key, bucket=claim.bucket, max_bytes=settings.MAX_UPLOAD_BYTES)
        except (KeyError, PayloadTooLarge):
            return None

    def start(self, job_id: str, *, started_at: dt.datetime, progress: Any, owner: str, lease_s: float) -> Job | None:
        """Move a job to running as worker ``owner`` starts it (an attempt counted), with a lease of ``lease_s``;
        None when it may not run (cancelled, final, unknown, or running under another worker's live lease)."""
        return self.store.transition(
            job_id,
            JobStatus.RUNNING,
            count_attempt=True,
            started_at=started_at,
            progress=progress,
            lease=(owner, int(lease_s * 1000)),
        )

    def renew_leases(self, owner: str, job_ids: list[str], lease_s: float) -> list[str]:
        """Extend ``owner``'s leases on its running jobs; the ids it no longer holds."""
        return self.store.renew_leases(owner, job_ids, int(lease_s * 1000)) if job_ids else []
