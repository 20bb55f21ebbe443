"""An upload job's deadline: scheduled when the job is made, and the job expired once its window and grace are over."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from pydantic import ValidationError

from async_inference import settings
from async_inference.aws import JobStore, UploadDeadlines
from async_inference.jobs import JobStatus
from async_inference.jobs_service.outcomes import JobOutcomes
from async_inference.jobs_service.shared import ErrorKind, ServiceError
from async_inference.schemas import Job, UploadDeadline, utcnow


@dataclass(frozen=True)
class DeadlineCheck:
    """What an upload deadline found: the job as it stands (None: no such job, or not a deadline message), and
    ``retry_in_s`` > 0 when the window and its grace are not over yet, so the deadline must be looked at again."""

    job: Job | None
    retry_in_s: int = 0


class UploadDeadlineWatch:
    """Upload jobs whose upload never came: each expired, and notified, once its window and the grace are over."""

    def __init__(
        self,
        *,
        store: JobStore,
        outcomes: JobOutcomes,
        deadlines: UploadDeadlines | None = None,
        upload_grace_s: int = settings.UPLOAD_GRACE_S,
    ) -> None:
        self.store = store
        self.outcomes = outcomes
        # None: upload jobs get no scheduled expiry (a GET after the window still expires them).
        self.deadlines = deadlines
        self.upload_grace_s = upload_grace_s

    def schedule(self, job: Job) -> None:
        """Schedule the job's deadline message for the end of its upload window; 503 when the queue refuses it."""
        if self.deadlines is None:
            return
        delay_s = math.ceil((job.upload_window_ends_at - utcnow()).total_seconds())
        try:
            self.deadlines.schedule(job.job_id, delay_s)
        except Exception as exc:
            # Nothing is stored yet: the client retries (with its Idempotency-Key, onto the same job id).
            raise ServiceError(
                ErrorKind.UNAVAILABLE, "unavailable", "the upload deadline queue is unavailable; retry the request"
            ) from exc

    def check(self, body: str) -> DeadlineCheck:
        """An upload job's deadline came due: expire the job if it is still awaiting its upload once its window and
        the grace are over; if they are not (the message came early), say how long until they are."""
        try:
            deadline = UploadDeadline.model_validate_json(body)
        except ValidationError:
            return DeadlineCheck(None)
        job = self.store.get(deadline.job_id)
        if job is None:
            return DeadlineCheck(None)
        if job.status is JobStatus.EXPIRED and not job.notified:
            self.outcomes.notify(job)  # expired by an earlier delivery (or a GET) whose notification did not go out
            return DeadlineCheck(job)
        if job.status is not JobStatus.AWAITING_UPLOAD:
            return DeadlineCheck(job)  # its upload arrived, or it was cancelled: nothing to do
        left_s = self.grace_left_s(job)
        if left_s > 0:
            return DeadlineCheck(job, retry_in_s=math.ceil(left_s))
        return DeadlineCheck(self.expire(job) or self.store.get(job.job_id))

    def expire_if_due(self, job: Job) -> Job:
        """The job as a read should see it: expired when it still awaits its upload past its window and grace."""
        if job.status is JobStatus.AWAITING_UPLOAD and self.grace_left_s(job) <= 0:
            return self.expire(job) or self.store.get(job.job_id) or job
        return job

    def grace_left_s(self, job: Job) -> float:
        """Seconds until the job's upload window and its grace are over (negative once they are)."""
        ends = job.upload_window_ends_at + dt.timedelta(seconds=self.upload_grace_s)
        return (ends - utcnow()).total_seconds()

    def expire(self, job: Job) -> Job | None:
        """Expire a job still awaiting its upload; None when it left that state meanwhile (its upload was queued)."""
        window_s = round((job.upload_window_ends_at - job.created_at).total_seconds())
        return self.outcomes.finish(
            job,
            JobStatus.EXPIRED,
            only_from={JobStatus.AWAITING_UPLOAD},
            error=f"the upload did not arrive within its {window_s}-second presign window",
        )
