"""The API's side of jobs: submit (idempotently), read, list, cancel and delete a tenant's jobs."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from async_inference import settings
from async_inference.aws import Blobs, JobStore
from async_inference.fleets import kind_of_endpoint
from async_inference.jobs import FINAL_STATES, JobStatus, new_job_id
from async_inference.jobs_service.deadlines import UploadDeadlineWatch
from async_inference.jobs_service.outcomes import JobOutcomes
from async_inference.jobs_service.queueing import JobQueues
from async_inference.jobs_service.shared import ErrorKind, ModelChecks, ServiceError
from async_inference.quotas import TenantQuota, quota_exceeded_message
from async_inference.schemas import (
    CHAT_ENDPOINT,
    Job,
    JobSubmission,
    JobView,
    PresignedUpload,
    PresignedUrl,
    WebhookState,
    engine_rows,
    utcnow,
)
from async_inference.webhooks.url_safety import UnsafeUrl, check_url


@dataclass(frozen=True)
class Submitted:
    job: Job
    created: bool  # False when an Idempotency-Key matched an existing job
    upload: PresignedUpload | None = None


class JobApi:
    """What the API (and the event intake, and background responses) does with a tenant's jobs."""

    def __init__(
        self,
        *,
        store: JobStore,
        blobs: Blobs,
        models: ModelChecks,
        queues: JobQueues,
        deadlines: UploadDeadlineWatch,
        outcomes: JobOutcomes,
        allow_local_webhooks: bool = False,
        idempotency_in_progress_s: int = settings.IDEMPOTENCY_IN_PROGRESS_S,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.models = models
        self.queues = queues
        self.deadlines = deadlines
        self.outcomes = outcomes
        self.allow_local_webhooks = allow_local_webhooks
        self.idempotency_in_progress_s = idempotency_in_progress_s

    @property
    def payload_retention_days(self) -> int:
        """Days a request or result object is kept after it is written (the bucket's lifecycle rule)."""
        return self.outcomes.payload_retention_days

    def submit(
        self,
        tenant: str,
        submission: JobSubmission,
        idempotency_key: str | None,
        *,
        job_id: str | None = None,
        webhook_events: list[str] | None = None,
    ) -> Submitted:
        """Create and queue the job (or, for an upload, create it awaiting its upload).

        With an Idempotency-Key, the key is bound to the first request's fingerprint: a retry of the same request
        gets the same job (``created`` False), a different request a 422. A different request that arrives while the
        first one is in progress (its body stored, its job not created yet: at most ``IDEMPOTENCY_IN_PROGRESS_S``)
        gets a 409 and may retry; the job record, created with a conditional write, is the one commit point.
        ``job_id``: the id to create (a background response writes its own object under it first);
        ``webhook_events``: the events its webhook records instead of ``submission.webhook.events`` (a background
        response's ``response.*``, async_inference.webhooks.events.RESPONSE_EVENTS).
        """
        job_id = job_id or new_job_id(tenant, idempotency_key)
        fingerprint = submission.fingerprint()
        if idempotency_key is not None:
            existing = self.store.get(job_id)
            if existing is not None:
                return self._replay(existing, fingerprint, idempotency_key)
        if submission.webhook is not None:
            self._check_webhook_url(submission.webhook.url)
        if submission.priority == "batch" and not self.queues.has_lane(
            submission.request.model if submission.request else None
        ):
            message = 'this deployment has no batch lane; submit with priority "interactive"'
            raise ServiceError(
                ErrorKind.INVALID,
                "invalid_request",
                f"priority: {message}",
                [{"field": "priority", "message": message}],
            )
        request = submission.request
        if request is not None:
            self.models.check_model(request.model, field="request.model", kind=kind_of_endpoint(submission.endpoint))
            self.models.check_limits(tenant, request, prefix="request.")
        self._check_quota(tenant)
        now = utcnow()
        inline = request is not None
        key = settings.request_key(tenant, job_id) if inline else settings.upload_key(tenant, job_id)
        job = Job(
            job_id=job_id,
            tenant=tenant,
            status=JobStatus.QUEUED if inline else JobStatus.AWAITING_UPLOAD,
            created_at=now,
            updated_at=now,
            model=request.model if request else None,
            metadata=submission.metadata,
            request_bucket=self.blobs.bucket,
            request_key=key,
            upload_size_bytes=submission.upload.size_bytes if submission.upload else None,
            deadline=now + dt.timedelta(seconds=submission.ttl_seconds or settings.DEFAULT_TTL_S),
            timeout_s=submission.timeout_seconds or settings.DEFAULT_EXECUTION_TIMEOUT_S,
            idempotency_key=idempotency_key,
            request_fingerprint=fingerprint,
            webhook=WebhookState(url=submission.webhook.url, events=webhook_events or list(submission.webhook.events))
            if submission.webhook
            else None,
            priority=submission.priority,
            endpoint=submission.endpoint if submission.endpoint != CHAT_ENDPOINT else None,
            rows=engine_rows(request) if request is not None else 1,
        )
        if request is not None:
            # The payload is in S3 before the job exists, so no reader ever sees a job without its payload.
            owner = self._store_request(job, request.model_dump_json(exclude_none=True).encode())
            if owner is not None:
                return self._replay(owner, fingerprint, idempotency_key)
        else:
            # Scheduled before the job exists, so no upload job is ever without its expiry; a deadline for a job that
            # was then not created (a failed write, a lost race) finds no job, or the winner's, and is harmless.
            self.deadlines.schedule(job)
        if not self.store.create(job):
            # Lost a race with a concurrent retry carrying the same Idempotency-Key.
            existing = self.store.get(job_id)
            assert existing is not None
            return self._replay(existing, fingerprint, idempotency_key)
        if inline:
            self.queues.enqueue(job)
        return Submitted(job, created=True, upload=self._upload_for(job))

    def _check_quota(self, tenant: str) -> None:
        """429 quota_exceeded when the tenant has ``max_active_jobs`` unfinished jobs (async_inference.quotas)."""
        quotas = self.models.quotas
        if quotas is None:
            return
        limit = quotas.get(tenant, TenantQuota()).max_active_jobs
        if self.store.count_active(tenant, up_to=limit) >= limit:
            message = quota_exceeded_message(tenant, limit)
            raise ServiceError(
                ErrorKind.QUOTA, "quota_exceeded", message, [{"field": "max_active_jobs", "message": message}]
            )

    def _replay(self, existing: Job, fingerprint: str, idempotency_key: str | None) -> Submitted:
        """The answer to a request whose Idempotency-Key already has a job: that job, if the request is the same."""
        # Jobs stored before fingerprints were recorded have none: they match any retry, as they did then.
        if existing.request_fingerprint not in (None, fingerprint):
            raise ServiceError(
                ErrorKind.MISMATCH,
                "idempotency_key_reused",
                f"Idempotency-Key {idempotency_key!r} was used for a different request (job {existing.job_id}); "
                "send a new key for a new request",
            )
        return Submitted(existing, created=False, upload=self._upload_for(existing))

    def _store_request(self, job: Job, body: bytes) -> Job | None:
        """Write an inline job's request body; with an Idempotency-Key, never over another request's body.

        The key maps to one job id, hence one request key. The body is written only if no object is there (S3
        conditional write), or the one there is the same. Another body there means another request with this key:
        if it created its job meanwhile, that job is returned (the caller compares fingerprints); if it is still in
        progress, 409; if it was written longer ago than a request can run, its request ended without a job, and it
        is replaced.
        """
        if job.idempotency_key is None:
            self.blobs.put_json(job.request_key, body)
            return None
        for _ in range(2):
            stored = self.blobs.put_json_once(job.request_key, body)
            if stored is None or stored == body:
                return None
            owner = self.store.get(job.job_id)
            if owner is not None:
                return owner
            written = self.blobs.written_at(job.request_key)
            if written is not None and (utcnow() - written).total_seconds() < self.idempotency_in_progress_s:
                break
            # Deleted, then written once: of two requests replacing a stale body at once, one writes, one gets a 409.
            self.blobs.delete(job.request_key)
        raise ServiceError(
            ErrorKind.CONFLICT,
            "idempotency_key_in_progress",
            f"a request with Idempotency-Key {job.idempotency_key!r} and a different body is in progress; retry in a "
            "few seconds",
        )

    def _check_webhook_url(self, url: str) -> None:
        """400 for a URL the dispatcher would refuse (SSRF): checked here too so the client learns it at once."""
        try:
            check_url(url, allow_local=self.allow_local_webhooks)
        except UnsafeUrl as exc:
            raise ServiceError(
                ErrorKind.INVALID,
                "invalid_request",
                f"webhook.url: {exc}",
                [{"field": "webhook.url", "message": str(exc)}],
            ) from exc

    def _upload_for(self, job: Job) -> PresignedUpload | None:
        """A presigned PUT for an upload job, valid until the job's upload window ends (never beyond, also for an
        idempotent retry); None when the job takes no upload or its window is over."""
        if job.status is not JobStatus.AWAITING_UPLOAD or job.upload_size_bytes is None:
            return None
        left_s = (job.upload_window_ends_at - utcnow()).total_seconds()
        if left_s <= 0:
            return None
        expires_s = math.ceil(left_s)
        url, headers = self.blobs.presign_put(job.request_key, size_bytes=job.upload_size_bytes, expires_s=expires_s)
        return PresignedUpload(url=url, headers=headers, expires_at=utcnow() + dt.timedelta(seconds=expires_s))

    # --- Reads and the client's moves -----------------------------------------------------------------------------

    def get(self, tenant: str, job_id: str) -> Job:
        """The tenant's job; 404 for unknown ids and for other tenants' jobs alike, so ids cannot be probed."""
        job = self.store.get(job_id)
        if job is None or job.tenant != tenant:
            raise ServiceError(ErrorKind.NOT_FOUND, "not_found", f"no job {job_id}")
        return self.deadlines.expire_if_due(job)

    def read(self, tenant: str, job_id: str) -> tuple[JobView, int | None]:
        """What GET /v1/jobs/{id} answers: the job's view and, while it is unfinished, the seconds to wait before the
        next poll (``poll_after_s``); 410 once its result has expired (no URL to a deleted object)."""
        job = self.get(tenant, job_id)
        expires_at = self._result_expires_at(job)
        if expires_at is not None and utcnow() >= expires_at:
            raise ServiceError(
                ErrorKind.GONE,
                "result_expired",
                f"the result of job {job_id} expired at {expires_at.isoformat()}: results are kept "
                f"{self.payload_retention_days} days after they are written",
            )
        return self.view(job), poll_after_s(job)

    def view(self, job: Job, *, upload: PresignedUpload | None = None) -> JobView:
        """The job as the API shows it, with a presigned GET of its result while the result is kept."""
        result = None
        expires_at = self._result_expires_at(job)
        left_s = (expires_at - utcnow()).total_seconds() if expires_at else 0
        if job.status is JobStatus.SUCCEEDED and job.result_key and left_s > 0:
            # Never valid beyond the object's own expiry.
            expires_s = min(settings.PRESIGNED_RESULT_EXPIRY_S, math.ceil(left_s))
            url = self.blobs.presign_get(job.result_key, expires_s=expires_s)
            result = PresignedUrl(url=url, expires_at=min(utcnow() + dt.timedelta(seconds=expires_s), expires_at))  # type: ignore[type-var]
        return JobView(
            **job.model_dump(
                include={"job_id", "status", "created_at", "started_at", "finished_at", "attempts", "model"}
                | {"metadata", "error", "error_code", "usage", "webhook", "priority"}
            ),
            result=result,
            result_expires_at=expires_at,
            upload=upload,
            # Tokens so far, while the job runs; once it is final, its usage says what it generated.
            progress=job.progress if job.status is JobStatus.RUNNING else None,
        )

    def _result_expires_at(self, job: Job) -> dt.datetime | None:
        """When the job's result expires; for a result stored before jobs recorded it, as its finish time gives."""
        if job.status is not JobStatus.SUCCEEDED or not job.result_key:
            return None
        if job.result_expires_at is not None:
            return job.result_expires_at
        return settings.lifecycle_expiry(job.finished_at or job.updated_at, self.payload_retention_days)

    def list(
        self, tenant: str, *, status: JobStatus | None, limit: int, next_token: str | None
    ) -> tuple[list[Job], str | None]:
        try:
            return self.store.list_for_tenant(tenant, status=status, limit=limit, next_token=next_token)
        except ValueError as exc:
            raise ServiceError(
                ErrorKind.INVALID, "invalid_request", str(exc), [{"field": "next", "message": str(exc)}]
            ) from exc

    def cancel(self, tenant: str, job_id: str) -> Job:
        job = self.get(tenant, job_id)
        if job.status in FINAL_STATES:
            raise ServiceError(
                ErrorKind.CONFLICT, "conflict", f"job {job_id} is already {job.status.value} and cannot be cancelled"
            )
        cancelled = self.outcomes.finish(job, JobStatus.CANCELLED, error="cancelled by the client")
        if cancelled is None:  # it finished between our read and our write
            job = self.get(tenant, job_id)
            raise ServiceError(
                ErrorKind.CONFLICT, "conflict", f"job {job_id} is already {job.status.value} and cannot be cancelled"
            )
        return cancelled

    def delete(self, tenant: str, job_id: str) -> None:
        """Delete a final job: its result and request objects (a presigned result URL given out before stops working),
        then its record, so the id is a 404 from then on; 409 for a job not final yet (cancel it first)."""
        job = self.get(tenant, job_id)
        if job.status not in FINAL_STATES:
            raise ServiceError(
                ErrorKind.CONFLICT, "conflict", f"job {job_id} is {job.status.value}: cancel it before deleting it"
            )
        for key in (job.result_key, job.request_key):
            if key:
                self.blobs.delete(key)
        self.store.delete(job_id)


def poll_after_s(job: Job) -> int | None:
    """Seconds a poller should wait before reading an unfinished job again (settings.POLL_AFTER_FRACTION of its
    time in its state, 1 to settings.MAX_POLL_AFTER_S); None for a final job."""
    if job.status in FINAL_STATES:
        return None
    since = job.started_at if job.status is JobStatus.RUNNING and job.started_at else job.updated_at
    age_s = max((utcnow() - since).total_seconds(), 0.0)
    return min(max(1, math.ceil(age_s / settings.POLL_AFTER_FRACTION)), settings.MAX_POLL_AFTER_S)
