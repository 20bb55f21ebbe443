"""What the service does with a job, independent of how the request arrived (API, S3 event, DLQ, worker).

Handlers are thin adapters over this module; it talks to AWS only through the adapters in ``aws.py``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from async_inference import settings, webhooks
from async_inference.config import ServiceConfig
from async_inference.aws import Blobs, JobQueue, JobStore, Notifier, PayloadTooLarge
from async_inference.jobs import FINAL_STATES, JobStatus, new_job_id
from async_inference.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ClaimCheck,
    Job,
    JobSubmission,
    JobView,
    PresignedUpload,
    PresignedUrl,
    ResultNotification,
    S3Location,
    Timings,
    WebhookState,
    utcnow,
)


class ApiError(Exception):
    """An error the client can fix or must know about; the API turns it into a JSON 4xx/5xx."""

    def __init__(self, status: int, code: str, message: str, details: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []


def describe_validation_error(exc: ValidationError, prefix: str = "") -> tuple[str, list[dict[str, str]]]:
    """A one-line message naming the first bad field, and one detail per error."""
    details = []
    for error in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in error["loc"] if p not in ("function-after",))
        field = ".".join(filter(None, [prefix, loc]))
        details.append({"field": field or "(body)", "message": error["msg"]})
    first = details[0] if details else {"field": "(body)", "message": "invalid"}
    return f"{first['field']}: {first['message']}", details


@dataclass(frozen=True)
class Submitted:
    job: Job
    created: bool  # False when an Idempotency-Key matched an existing job
    upload: PresignedUpload | None = None


class JobService:
    def __init__(
        self, *, store: JobStore, blobs: Blobs, queue: JobQueue, notifier: Notifier, allow_local_webhooks: bool = False
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.queue = queue
        self.notifier = notifier
        self.allow_local_webhooks = allow_local_webhooks

    @classmethod
    def from_config(cls, config: ServiceConfig, *, allow_local_webhooks: bool = False) -> JobService:
        """The service over the resources ``config`` names, with one set of clients for the process."""
        return cls(
            store=JobStore(config.table_name),
            blobs=Blobs(config.bucket_name),
            queue=JobQueue(config.queue_url),
            notifier=Notifier(config.topic_arn),
            allow_local_webhooks=allow_local_webhooks,
        )

    # --- API side -------------------------------------------------------------------------------------------------

    def submit(self, tenant: str, submission: JobSubmission, idempotency_key: str | None) -> Submitted:
        job_id = new_job_id(tenant, idempotency_key)
        if idempotency_key is not None:
            existing = self.store.get(job_id)
            if existing is not None:
                return Submitted(existing, created=False, upload=self._upload_for(existing))
        if submission.webhook is not None:
            self._check_webhook_url(submission.webhook.url)
        now = utcnow()
        request = submission.request
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
            webhook=WebhookState(url=submission.webhook.url, events=list(submission.webhook.events))
            if submission.webhook
            else None,
        )
        if inline:
            # The payload is in S3 before the job exists, so no reader ever sees a job without its payload.
            self.blobs.put_json(key, request.model_dump_json(exclude_none=True).encode())
        if not self.store.create(job):
            # Lost a race with a concurrent retry carrying the same Idempotency-Key.
            existing = self.store.get(job_id)
            assert existing is not None
            return Submitted(existing, created=False, upload=self._upload_for(existing))
        if inline:
            self._enqueue(job)
        return Submitted(job, created=True, upload=self._upload_for(job))

    def _check_webhook_url(self, url: str) -> None:
        """400 for a URL the dispatcher would refuse (SSRF): checked here too so the client learns it at once."""
        try:
            webhooks.check_url(url, allow_local=self.allow_local_webhooks)
        except webhooks.UnsafeUrl as exc:
            raise ApiError(400, "invalid_request", f"webhook.url: {exc}", [{"field": "webhook.url", "message": str(exc)}]) from exc

    def _enqueue(self, job: Job) -> None:
        try:
            self.queue.send(job.claim_check())
        except Exception as exc:
            # The job was accepted into the table but could not be queued: end it with a reason rather than leave it
            # queued forever, and let the client retry.
            failed = self.store.transition(job.job_id, JobStatus.FAILED, error=f"could not enqueue the job: {exc}")
            if failed is not None:
                self.notify(failed)
            raise ApiError(503, "unavailable", "the job queue is unavailable; retry the request") from exc

    def _upload_for(self, job: Job) -> PresignedUpload | None:
        if job.status is not JobStatus.AWAITING_UPLOAD or job.upload_size_bytes is None:
            return None
        expires_s = min(settings.PRESIGNED_UPLOAD_EXPIRY_S, max(1, int((job.deadline - utcnow()).total_seconds())))
        url, headers = self.blobs.presign_put(job.request_key, size_bytes=job.upload_size_bytes, expires_s=expires_s)
        return PresignedUpload(url=url, headers=headers, expires_at=utcnow() + dt.timedelta(seconds=expires_s))

    def get(self, tenant: str, job_id: str) -> Job:
        """The tenant's job; 404 for unknown ids and for other tenants' jobs alike, so ids cannot be probed."""
        job = self.store.get(job_id)
        if job is None or job.tenant != tenant:
            raise ApiError(404, "not_found", f"no job {job_id}")
        if job.status is JobStatus.AWAITING_UPLOAD and utcnow() > job.deadline:
            job = self.finish(job, JobStatus.EXPIRED, error="the upload did not arrive before the deadline") or job
        return job

    def view(self, job: Job, *, upload: PresignedUpload | None = None) -> JobView:
        result = None
        if job.status is JobStatus.SUCCEEDED and job.result_key:
            url = self.blobs.presign_get(job.result_key, expires_s=settings.PRESIGNED_RESULT_EXPIRY_S)
            result = PresignedUrl(url=url, expires_at=utcnow() + dt.timedelta(seconds=settings.PRESIGNED_RESULT_EXPIRY_S))
        return JobView(
            **job.model_dump(
                include={"job_id", "status", "created_at", "started_at", "finished_at", "attempts", "model"}
                | {"metadata", "error", "usage", "webhook"}
            ),
            result=result,
            upload=upload,
        )

    def list(self, tenant: str, *, status: JobStatus | None, limit: int, next_token: str | None) -> tuple[list[Job], str | None]:
        try:
            return self.store.list_for_tenant(tenant, status=status, limit=limit, next_token=next_token)
        except ValueError as exc:
            raise ApiError(400, "invalid_request", str(exc), [{"field": "next", "message": str(exc)}]) from exc

    def cancel(self, tenant: str, job_id: str) -> Job:
        job = self.get(tenant, job_id)
        if job.status in FINAL_STATES:
            raise ApiError(409, "conflict", f"job {job_id} is already {job.status.value} and cannot be cancelled")
        cancelled = self.finish(job, JobStatus.CANCELLED, error="cancelled by the client")
        if cancelled is None:  # it finished between our read and our write
            job = self.get(tenant, job_id)
            raise ApiError(409, "conflict", f"job {job_id} is already {job.status.value} and cannot be cancelled")
        return cancelled

    # --- Upload events --------------------------------------------------------------------------------------------

    def accept_upload(self, key: str, size_bytes: int) -> Job | None:
        """An object landed under the upload prefix: check it and queue its job, or fail the job with a reason."""
        parsed = settings.parse_upload_key(key)
        if parsed is None:
            return None
        tenant, job_id = parsed
        job = self.store.get(job_id)
        if job is None or job.tenant != tenant:
            self.blobs.delete(key)  # an object no job asked for
            return None
        if job.status is JobStatus.AWAITING_UPLOAD:
            request, reason = self._check_upload(job, key, size_bytes)
            if request is None:
                return self.finish(job, JobStatus.FAILED, error=f"upload rejected: {reason}")
            if utcnow() > job.deadline:
                return self.finish(job, JobStatus.EXPIRED, error="the upload arrived after the job's deadline")
            queued = self.store.transition(job.job_id, JobStatus.QUEUED, model=request.model)
            if queued is None:
                return self.store.get(job_id)
            job = queued
        if job.status is JobStatus.QUEUED:
            # Also reached when a redelivered event finds the job queued already: a crash may have come between
            # the state write and the send, and a second claim check is harmless (the worker runs a job once).
            self._enqueue(job)
        return job

    def _check_upload(self, job: Job, key: str, size_bytes: int) -> tuple[ChatCompletionRequest | None, str]:
        """The uploaded request, or None and what is wrong with the upload."""
        announced = job.upload_size_bytes or 0
        if size_bytes > settings.MAX_UPLOAD_BYTES or size_bytes != announced:
            # Oversize or unannounced bodies are not kept: the tenant never agreed to store them.
            self.blobs.delete(key)
            return None, f"the object is {size_bytes} bytes but {announced} were announced (limit {settings.MAX_UPLOAD_BYTES})"
        try:
            body = self.blobs.get(key, max_bytes=settings.MAX_UPLOAD_BYTES)
        except (KeyError, PayloadTooLarge) as exc:
            return None, f"the object could not be read ({type(exc).__name__})"
        return parse_request_body(body)

    # --- Dead letters ---------------------------------------------------------------------------------------------

    def dead_letter(self, body: str, receive_count: int) -> Job | None:
        """A claim check reached the DLQ: fail its job (if it is not final yet) and notify."""
        try:
            claim = ClaimCheck.model_validate_json(body)
        except ValidationError:
            return None
        job = self.store.get(claim.job_id)
        if job is None:
            return None
        if job.status in FINAL_STATES:
            if not job.notified:
                self.notify(job)
            return job
        return self.finish(job, JobStatus.FAILED, error=f"dead-lettered after {receive_count} attempts")

    # --- Final states and notifications ---------------------------------------------------------------------------

    def finish(self, job: Job, target: JobStatus, *, result: ChatCompletion | None = None, **fields: Any) -> Job | None:
        """Move a job to a final state and publish its notification; None when the move was not allowed."""
        finished = self.end(job, target, **fields)
        if finished is not None:
            self.notify(finished, result=result)
        return finished

    def end(self, job: Job, target: JobStatus, **fields: Any) -> Job | None:
        """The state write of ``finish`` alone, marked not notified yet; the caller publishes (``notify_many``)."""
        return self.store.transition(job.job_id, target, notified=False, **fields)

    def store_result(self, job: Job, result: ChatCompletion) -> tuple[ChatCompletion, dict[str, Any]]:
        """Write the job's result object, once: the result that stands (an earlier run's, when one wrote first) and
        the fields its ``succeeded`` state records."""
        key = settings.result_key(job.tenant, job.job_id)
        stored = self.blobs.put_json_once(key, result.model_dump_json().encode())
        if stored is not None:
            # An earlier run of this job (a worker that crashed after writing) got there first: its result stands.
            result = ChatCompletion.model_validate_json(stored)
        return result, {"result_key": key, "usage": result.usage, "finish_reason": result.choices[0].finish_reason}

    def notify_many(self, finished: list[tuple[Job, ChatCompletion | None]]) -> list[bool]:
        """``notify`` for several jobs in batched requests (the worker's path at load); which ones went out."""
        notifications = [
            (build_notification(job, result=result, bucket=self.blobs.bucket), job.webhook is not None)
            for job, result in finished
        ]
        published = self.notifier.publish_batch(notifications)
        done = [job.job_id for (job, _), ok in zip(finished, published) if ok]
        if done:
            self.store.mark_notified(done)
        return published

    def notify(self, job: Job, *, result: ChatCompletion | None = None) -> None:
        """Publish the job's notification, then record that it was sent. A crash in between re-sends it on
        redelivery: subscribers see a notification at least once, and dedupe on job id."""
        notification = build_notification(job, result=result, bucket=self.blobs.bucket)
        self.notifier.publish(notification, has_webhook=job.webhook is not None)
        self.store.mark_notified([job.job_id])


def build_notification(job: Job, *, result: ChatCompletion | None, bucket: str) -> ResultNotification:
    inline = None
    if result is not None and len(result.model_dump_json()) <= settings.MAX_INLINE_RESULT_BYTES:
        inline = result
    queue_s = run_s = None
    if job.started_at:
        queue_s = (job.started_at - job.created_at).total_seconds()
        if job.finished_at:
            run_s = (job.finished_at - job.started_at).total_seconds()
    return ResultNotification(
        job_id=job.job_id,
        tenant=job.tenant,
        status=job.status,
        model=job.model,
        result_location=S3Location(bucket=bucket, key=job.result_key) if job.result_key else None,
        result=inline,
        usage=job.usage,
        error=job.error,
        metadata=job.metadata,
        timings=Timings(
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            queue_s=queue_s,
            run_s=run_s,
        ),
    )


def parse_request_body(body: bytes) -> tuple[ChatCompletionRequest | None, str]:
    """A stored request body as a ChatCompletionRequest, or None and why it is not one (for a failed job's reason)."""
    try:
        return ChatCompletionRequest.model_validate_json(body), ""
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            return None, "the body is not valid JSON"
        message, _ = describe_validation_error(exc)
        return None, f"the body is not a valid chat.completions request: {message}"
