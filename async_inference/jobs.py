"""Job states and the transitions between them.

Every state change is a conditional write whose condition is "the job is in one of the states this transition may
leave", so a redelivered message, a late worker or a racing cancel can never move a job backwards or out of a final
state.
"""

from __future__ import annotations

import uuid

# The states and the id format are part of the wire, defined in the client package; the moves between states are the
# service's.
from async_inference_client.models.jobs import FINAL_STATES as FINAL_STATES
from async_inference_client.models.jobs import JOB_ID_PATTERN as JOB_ID_PATTERN
from async_inference_client.models.jobs import JobStatus as JobStatus
from async_inference_client.models.jobs import is_job_id as is_job_id

# target state -> states it may be entered from. RUNNING -> RUNNING is a redelivery after a crash: a worker that starts
# a job takes a lease on it (``JobStore.transition(lease=...)``), and another worker may move it RUNNING -> RUNNING
# only once that lease has lapsed, so a copy of a claim check cannot start the job a second time while it runs.
ALLOWED_SOURCES: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.AWAITING_UPLOAD}),
    JobStatus.RUNNING: frozenset({JobStatus.QUEUED, JobStatus.RUNNING}),
    JobStatus.SUCCEEDED: frozenset({JobStatus.RUNNING}),
    JobStatus.FAILED: frozenset({JobStatus.AWAITING_UPLOAD, JobStatus.QUEUED, JobStatus.RUNNING}),
    JobStatus.CANCELLED: frozenset({JobStatus.AWAITING_UPLOAD, JobStatus.QUEUED, JobStatus.RUNNING}),
    JobStatus.EXPIRED: frozenset({JobStatus.AWAITING_UPLOAD, JobStatus.QUEUED}),
}


def sources_of(target: JobStatus) -> frozenset[JobStatus]:
    """The states a job may be in for a move to ``target`` to be allowed."""
    return ALLOWED_SOURCES[target]


# Namespace for ids derived from (tenant, Idempotency-Key): a retried POST maps to the same job id.
_IDEMPOTENCY_NAMESPACE = uuid.UUID("5b0d7a52-3f5e-4d0e-9a57-0c1f3c1a9e11")


def new_job_id(tenant: str, idempotency_key: str | None = None) -> str:
    """A fresh job id, or the one that (tenant, idempotency_key) always maps to."""
    if idempotency_key is None:
        return f"job_{uuid.uuid4().hex}"
    name = tenant + "\x00" + idempotency_key
    return f"job_{uuid.uuid5(_IDEMPOTENCY_NAMESPACE, name).hex}"
