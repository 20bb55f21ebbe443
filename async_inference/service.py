"""What the service does with a job, independent of how the request arrived (API, S3 event, DLQ, worker).

Handlers are thin adapters over this module; it talks to AWS only through the adapters in ``aws/``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from async_inference import safe_json, settings
from async_inference.aws import Blobs, JobQueue, JobStore, Notifier, PayloadTooLarge, UploadDeadlines
from async_inference.config import ServiceConfig, WakeSettings
from async_inference.fleets import CHAT, FleetRoute, kind_of_endpoint, route_of, wrong_kind_message
from async_inference.jobs import FINAL_STATES, JobStatus, new_job_id
from async_inference.limits import LimitExceeded, RequestLimits, check_request, clip, field_in, limits_for
from async_inference.quotas import TenantQuota, quota_exceeded_message
from async_inference.schemas import (
    CHAT_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    ChatCompletion,
    ChatCompletionRequest,
    ClaimCheck,
    EmbeddingList,
    EmbeddingRequest,
    Job,
    JobSubmission,
    JobView,
    PresignedUpload,
    PresignedUrl,
    ResultNotification,
    S3Location,
    Timings,
    UploadDeadline,
    Usage,
    WebhookState,
    engine_rows,
    error_location,
    error_message,
    utcnow,
)
from async_inference.served_models import ServedModels
from async_inference.wake import ServiceWaker
from async_inference.webhooks.url_safety import UnsafeUrl, check_url

JobResult = ChatCompletion | EmbeddingList  # a job's result object: a chat.completion, or an embeddings job's list


class NotAClaimCheck(ValueError):
    """A dead-lettered message that is not a claim check: there is no job to fail; it is left for an operator."""


class ServiceError(Exception):
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
        loc = clip(error_location(error), 200)  # a field's name is the caller's: a 1 MB one is quoted by its start
        field = ".".join(filter(None, [prefix, loc if loc != "(body)" else ""]))
        details.append({"field": field or "(body)", "message": error_message(error)})
    first = details[0] if details else {"field": "(body)", "message": "invalid"}
    return f"{first['field']}: {first['message']}", details


@dataclass(frozen=True)
class Submitted:
    job: Job
    created: bool  # False when an Idempotency-Key matched an existing job
    upload: PresignedUpload | None = None


@dataclass(frozen=True)
class DeadlineCheck:
    """What an upload deadline found: the job as it stands (None: no such job, or not a deadline message), and
    ``retry_in_s`` > 0 when the window and its grace are not over yet, so the deadline must be looked at again."""

    job: Job | None
    retry_in_s: int = 0


class JobService:
    def __init__(
        self,
        *,
        store: JobStore,
        blobs: Blobs,
        notifier: Notifier,
        queue: JobQueue | None = None,
        deadlines: UploadDeadlines | None = None,
        upload_grace_s: int = settings.UPLOAD_GRACE_S,
        allow_local_webhooks: bool = False,
        served: ServedModels | None = None,
        idempotency_in_progress_s: int = settings.IDEMPOTENCY_IN_PROGRESS_S,
        payload_retention_days: int = settings.PAYLOAD_RETENTION_DAYS,
        quotas: Mapping[str, TenantQuota] | None = None,
        fleets: Mapping[str, FleetRoute] | None = None,
        wake: WakeSettings | None = None,
        limits: RequestLimits | None = None,
    ) -> None:
        self.store = store
        # The deployment's bounds on one request's cost; a tenant's plan may change them (async_inference.limits).
        self.limits = limits or RequestLimits()
        # Each model's queues and service (async_inference.fleets), the only way to a queue: a model without a route
        # is not served. None: no job is queued (a worker's service, which takes jobs from ``queue``).
        self.fleets = dict(fleets or {})
        # None: queueing a job wakes nothing (the scaling alarms still start a task).
        self._wake = wake
        self._routed: dict[str, tuple[JobQueue, JobQueue | None, ServiceWaker | None]] = {}
        # None: no quotas (a store without the index of unfinished jobs); a tenant missing from it gets the defaults.
        self.quotas = quotas
        self.blobs = blobs
        # A worker's own job queue (None in the functions, which queue by route).
        self.queue = queue
        self.notifier = notifier
        # None: upload jobs get no scheduled expiry (a GET after the window still expires them).
        self.deadlines = deadlines
        self.upload_grace_s = upload_grace_s
        self.allow_local_webhooks = allow_local_webhooks
        self.served = served or ServedModels.of(None)
        self.idempotency_in_progress_s = idempotency_in_progress_s
        self.payload_retention_days = payload_retention_days

    @classmethod
    def from_config(
        cls,
        config: ServiceConfig,
        *,
        allow_local_webhooks: bool = False,
        served_models: list[str] | None = None,
        quotas: Mapping[str, TenantQuota] | None = None,
        limits: RequestLimits | None = None,
    ) -> JobService:
        """The service over the resources ``config`` names, with one set of clients for the process;
        ``served_models`` (the SERVED_MODELS setting) are the model names a job may ask for (None: any); ``quotas``
        (the TENANT_QUOTAS setting) the per-tenant limits checked at submit (None: none); ``limits`` (the
        REQUEST_LIMITS setting) the deployment's bounds on one request's cost (None: the defaults)."""
        return cls(
            store=JobStore(config.table_name),
            blobs=Blobs(config.bucket_name),
            queue=JobQueue(config.queue_url) if config.queue_url else None,
            notifier=Notifier(config.topic_arn),
            deadlines=UploadDeadlines(config.upload_deadlines_queue_url) if config.upload_deadlines_queue_url else None,
            allow_local_webhooks=allow_local_webhooks,
            served=ServedModels.of(served_models),
            payload_retention_days=config.payload_retention_days,
            quotas=quotas,
            fleets=config.fleets,
            wake=config.wake,
            limits=limits,
        )

    # --- API side -------------------------------------------------------------------------------------------------

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
        if submission.priority == "batch" and not self._has_lane(
            submission.request.model if submission.request else None
        ):
            message = 'this deployment has no batch lane; submit with priority "interactive"'
            raise ServiceError(
                400, "invalid_request", f"priority: {message}", [{"field": "priority", "message": message}]
            )
        request = submission.request
        if request is not None:
            self.check_model(request.model, field="request.model", kind=kind_of_endpoint(submission.endpoint))
            self.check_limits(tenant, request, prefix="request.")
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
        if inline:
            # The payload is in S3 before the job exists, so no reader ever sees a job without its payload.
            owner = self._store_request(job, request.model_dump_json(exclude_none=True).encode())
            if owner is not None:
                return self._replay(owner, fingerprint, idempotency_key)
        else:
            # Scheduled before the job exists, so no upload job is ever without its expiry; a deadline for a job that
            # was then not created (a failed write, a lost race) finds no job, or the winner's, and is harmless.
            self._schedule_upload_deadline(job)
        if not self.store.create(job):
            # Lost a race with a concurrent retry carrying the same Idempotency-Key.
            existing = self.store.get(job_id)
            assert existing is not None
            return self._replay(existing, fingerprint, idempotency_key)
        if inline:
            self._enqueue(job)
        return Submitted(job, created=True, upload=self._upload_for(job))

    def check_model(self, model: str, *, field: str = "model", kind: str = CHAT) -> None:
        """404 model_not_found for a model this deployment does not serve, as vLLM and OpenAI answer; 400
        model_kind_mismatch for a model of another kind (a chat request for an embedding model) naming its endpoint."""
        problem = self.model_problem(model, kind)
        if problem is not None:
            status, code, message = problem
            raise ServiceError(status, code, message, [{"field": field, "message": message}])

    def model_problem(self, model: str, kind: str = CHAT) -> tuple[int, str, str] | None:
        """Why a request of ``kind`` cannot run on ``model`` (status, code, message), or None when it can. The
        ``ANY_MODEL`` route takes a model of either kind."""
        if not self.served.serves(model) or route_of(self.fleets, model) is None:
            return 404, "model_not_found", self.served.not_found_message(model)
        route = self.fleets.get(model)
        if route is not None and route.kind != kind:
            return 400, "model_kind_mismatch", wrong_kind_message(model, route.kind, kind)
        return None

    def limits_of(self, tenant: str) -> RequestLimits:
        """The bounds on the cost of ``tenant``'s requests: the deployment's, with its plan's overrides."""
        quota = (self.quotas or {}).get(tenant)
        return limits_for(self.limits, quota.request_limits if quota is not None else None)

    def check_limits(self, tenant: str, request: object, *, prefix: str = "", endpoint: str | None = None) -> None:
        """400 limit_exceeded (context_length_exceeded for the model's context), naming the field and the limit, for a
        chat request over one of the tenant's bounds on a request's cost (async_inference.limits); other requests
        (embeddings) are not bounded here. ``endpoint``: the one the request was converted from (``/v1/responses``),
        whose field names the error uses."""
        if not isinstance(request, ChatCompletionRequest):
            return
        try:
            check_request(request, self.limits_of(tenant))
        except LimitExceeded as exc:
            field = prefix + field_in(endpoint, exc.field)
            # A prompt that cannot fit is OpenAI's context_length_exceeded, which clients know as their own error.
            code = "context_length_exceeded" if exc.limit == "context_tokens" else "limit_exceeded"
            raise ServiceError(
                400, code, f"{field}: {exc.message}", [{"field": field, "message": exc.message}]
            ) from exc

    def _has_lane(self, model: str | None) -> bool:
        """Whether ``model``'s fleet has a batch lane (None, a model named only at upload: whether any fleet has)."""
        if model is None:
            return any(route.batch_queue_url for route in self.fleets.values())
        route = route_of(self.fleets, model)
        return route is not None and route.batch_queue_url is not None

    def _route(self, model: str) -> tuple[JobQueue, JobQueue | None, ServiceWaker | None]:
        """The job queue, batch lane and waker of ``model``'s fleet (its route, checked at submit)."""
        route = route_of(self.fleets, model)
        if route is None:
            raise ValueError(f"no fleet serves the model {model!r}: MODEL_FLEETS has no route for it")
        if model not in self._routed:
            target = self._wake.target(route) if self._wake is not None else None
            waker = ServiceWaker.for_target(target) if target is not None else None
            lane = JobQueue(route.batch_queue_url) if route.batch_queue_url else None
            self._routed[model] = (JobQueue(route.queue_url), lane, waker)
        return self._routed[model]

    def _check_quota(self, tenant: str) -> None:
        """429 quota_exceeded when the tenant has ``max_active_jobs`` unfinished jobs (async_inference.quotas)."""
        if self.quotas is None:
            return
        limit = self.quotas.get(tenant, TenantQuota()).max_active_jobs
        if self.store.count_active(tenant, up_to=limit) >= limit:
            message = quota_exceeded_message(tenant, limit)
            raise ServiceError(429, "quota_exceeded", message, [{"field": "max_active_jobs", "message": message}])

    def _replay(self, existing: Job, fingerprint: str, idempotency_key: str | None) -> Submitted:
        """The answer to a request whose Idempotency-Key already has a job: that job, if the request is the same."""
        # Jobs stored before fingerprints were recorded have none: they match any retry, as they did then.
        if existing.request_fingerprint not in (None, fingerprint):
            raise ServiceError(
                422,
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
            409,
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
                400, "invalid_request", f"webhook.url: {exc}", [{"field": "webhook.url", "message": str(exc)}]
            ) from exc

    def _enqueue(self, job: Job) -> None:
        # A job that reached the batch lane's priority before this function had a lane (a stale configuration) still
        # runs, on the job queue: queued in the wrong lane beats never queued.
        assert job.model is not None, "a queued job names its model (at submit, or when its upload is accepted)"
        queue, lane, waker = self._route(job.model)
        queue = lane if job.priority == "batch" and lane is not None else queue
        try:
            queue.send(job.claim_check())
        except Exception as exc:
            # The job was accepted into the table but could not be queued: end it with a reason rather than leave it
            # queued forever, and let the client retry.
            failed = self.store.transition(job.job_id, JobStatus.FAILED, error=f"could not enqueue the job: {exc}")
            if failed is not None:
                self.notify(failed)
            raise ServiceError(503, "unavailable", "the job queue is unavailable; retry the request") from exc
        if waker is not None:
            waker.job_queued()  # never raises: the job is queued whatever the wake finds

    def _schedule_upload_deadline(self, job: Job) -> None:
        if self.deadlines is None:
            return
        delay_s = math.ceil((job.upload_window_ends_at - utcnow()).total_seconds())
        try:
            self.deadlines.schedule(job.job_id, delay_s)
        except Exception as exc:
            # Nothing is stored yet: the client retries (with its Idempotency-Key, onto the same job id).
            raise ServiceError(
                503, "unavailable", "the upload deadline queue is unavailable; retry the request"
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

    def get(self, tenant: str, job_id: str) -> Job:
        """The tenant's job; 404 for unknown ids and for other tenants' jobs alike, so ids cannot be probed."""
        job = self.store.get(job_id)
        if job is None or job.tenant != tenant:
            raise ServiceError(404, "not_found", f"no job {job_id}")
        if job.status is JobStatus.AWAITING_UPLOAD and self._upload_grace_left_s(job) <= 0:
            job = self._expire_unuploaded(job) or self.store.get(job_id) or job
        return job

    def read(self, tenant: str, job_id: str) -> tuple[JobView, int | None]:
        """What GET /v1/jobs/{id} answers: the job's view and, while it is unfinished, the seconds to wait before the
        next poll (``poll_after_s``); 410 once its result has expired (no URL to a deleted object)."""
        job = self.get(tenant, job_id)
        expires_at = self._result_expires_at(job)
        if expires_at is not None and utcnow() >= expires_at:
            raise ServiceError(
                410,
                "result_expired",
                f"the result of job {job_id} expired at {expires_at.isoformat()}: results are kept "
                f"{self.payload_retention_days} days after they are written",
            )
        return self.view(job), self.poll_after_s(job)

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

    @staticmethod
    def poll_after_s(job: Job) -> int | None:
        """Seconds a poller should wait before reading an unfinished job again (settings.POLL_AFTER_FRACTION of its
        time in its state, 1 to settings.MAX_POLL_AFTER_S); None for a final job."""
        if job.status in FINAL_STATES:
            return None
        since = job.started_at if job.status is JobStatus.RUNNING and job.started_at else job.updated_at
        age_s = max((utcnow() - since).total_seconds(), 0.0)
        return min(max(1, math.ceil(age_s / settings.POLL_AFTER_FRACTION)), settings.MAX_POLL_AFTER_S)

    def list(
        self, tenant: str, *, status: JobStatus | None, limit: int, next_token: str | None
    ) -> tuple[list[Job], str | None]:
        try:
            return self.store.list_for_tenant(tenant, status=status, limit=limit, next_token=next_token)
        except ValueError as exc:
            raise ServiceError(400, "invalid_request", str(exc), [{"field": "next", "message": str(exc)}]) from exc

    def cancel(self, tenant: str, job_id: str) -> Job:
        job = self.get(tenant, job_id)
        if job.status in FINAL_STATES:
            raise ServiceError(409, "conflict", f"job {job_id} is already {job.status.value} and cannot be cancelled")
        cancelled = self.finish(job, JobStatus.CANCELLED, error="cancelled by the client")
        if cancelled is None:  # it finished between our read and our write
            job = self.get(tenant, job_id)
            raise ServiceError(409, "conflict", f"job {job_id} is already {job.status.value} and cannot be cancelled")
        return cancelled

    def delete(self, tenant: str, job_id: str) -> None:
        """Delete a final job: its result and request objects (a presigned result URL given out before stops working),
        then its record, so the id is a 404 from then on; 409 for a job not final yet (cancel it first)."""
        job = self.get(tenant, job_id)
        if job.status not in FINAL_STATES:
            raise ServiceError(409, "conflict", f"job {job_id} is {job.status.value}: cancel it before deleting it")
        for key in (job.result_key, job.request_key):
            if key:
                self.blobs.delete(key)
        self.store.delete(job_id)

    # --- Upload events --------------------------------------------------------------------------------------------

    def accept_upload(self, key: str, size_bytes: int) -> Job | None:
        """An object landed under the upload prefix: check it and queue its job, or fail the job with a reason.

        One job, one claim check: only the event whose state write takes the job out of ``awaiting_upload`` (a
        conditional write: one winner) sends it, after writing the bytes it checked to the job's request key, out of
        reach of the presigned URL. A PUT of that URL replayed after acceptance finds the job past
        ``awaiting_upload``: it is deleted and queues nothing, and it can no longer change what the job runs. The one
        exception is the redelivery of an acceptance interrupted between its state write and its send: a job queued
        more than the upload function's timeout ago whose claim check was never sent gets it sent then.
        """
        parsed = settings.parse_upload_key(key)
        if parsed is None:
            return None
        tenant, job_id = parsed
        job = self.store.get(job_id)
        if job is None or job.tenant != tenant:
            self.blobs.delete(key)  # an object no job asked for
            return None
        if job.status is not JobStatus.AWAITING_UPLOAD:
            if job.status is JobStatus.QUEUED and self._acceptance_interrupted(job):
                self._send_accepted(job)
            else:
                self.blobs.delete(key)  # a replayed PUT: the job has its request already
            return job
        only_awaiting = {JobStatus.AWAITING_UPLOAD}
        request, body, reason = self._check_upload(job, key, size_bytes)
        if request is None:
            return self._settled(
                job, self.finish(job, JobStatus.FAILED, only_from=only_awaiting, error=f"upload rejected: {reason}")
            )
        if (problem := self.model_problem(request.model, kind_of_endpoint(job.endpoint or CHAT_ENDPOINT))) is not None:
            _, code, message = problem
            return self._settled(
                job,
                self.finish(
                    job,
                    JobStatus.FAILED,
                    only_from=only_awaiting,
                    model=request.model,
                    error=f"upload rejected: {code}: {message}",
                ),
            )
        if utcnow() > job.deadline:
            return self._settled(
                job,
                self.finish(
                    job, JobStatus.EXPIRED, only_from=only_awaiting, error="the upload arrived after the job's deadline"
                ),
            )
        # The bytes checked, not the object at the upload key (a later PUT may have replaced it since the read).
        accepted_key = settings.request_key(tenant, job_id)
        self.blobs.put_json(accepted_key, body)
        queued = self.store.transition(
            job.job_id, JobStatus.QUEUED, model=request.model, request_key=accepted_key, rows=engine_rows(request)
        )
        if queued is None:
            return self.store.get(job_id)  # another event accepted it (and sends its claim check), or it ended
        self._send_accepted(queued)
        self.blobs.delete(key)
        return queued

    def _settled(self, job: Job, ended: Job | None) -> Job | None:
        """The job after a refusal: the one ended, or as it now stands when another event settled it first."""
        return ended if ended is not None else self.store.get(job.job_id)

    @staticmethod
    def _acceptance_interrupted(job: Job) -> bool:
        """Whether an upload job was accepted (queued) but its claim check never sent, by an invocation over now."""
        if job.claim_sent_at is not None or job.upload_size_bytes is None:
            return False
        return (utcnow() - job.updated_at).total_seconds() > settings.UPLOAD_INTAKE_TIMEOUT_S

    def _send_accepted(self, job: Job) -> None:
        self._enqueue(job)
        self.store.update(job.job_id, claim_sent_at=utcnow())

    def _check_upload(self, job: Job, key: str, size_bytes: int) -> tuple[ChatCompletionRequest | None, bytes, str]:
        """The uploaded request and the bytes it was read from, or None and what is wrong with the upload."""
        announced = job.upload_size_bytes or 0
        if size_bytes > settings.MAX_UPLOAD_BYTES or size_bytes != announced:
            # Oversize or unannounced bodies are not kept: the tenant never agreed to store them.
            self.blobs.delete(key)
            return (
                None,
                b"",
                f"the object is {size_bytes} bytes but {announced} were announced (limit {settings.MAX_UPLOAD_BYTES})",
            )
        try:
            body = self.blobs.get(key, max_bytes=settings.MAX_UPLOAD_BYTES)
        except (KeyError, PayloadTooLarge) as exc:
            return None, b"", f"the object could not be read ({type(exc).__name__})"
        if len(body) != announced:
            # The object was replaced between the event and the read: only the announced size is ever accepted.
            return None, b"", f"the object is {len(body)} bytes but {announced} were announced"
        request, reason = parse_request_body(body)
        try:
            self.check_limits(job.tenant, request)
        except ServiceError as exc:
            return None, body, f"{exc.code}: {exc.message}"
        return request, body, reason

    # --- Upload deadlines -----------------------------------------------------------------------------------------

    def check_upload_deadline(self, body: str) -> DeadlineCheck:
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
            self.notify(job)  # expired by an earlier delivery (or a GET) whose notification did not go out
            return DeadlineCheck(job)
        if job.status is not JobStatus.AWAITING_UPLOAD:
            return DeadlineCheck(job)  # its upload arrived, or it was cancelled: nothing to do
        left_s = self._upload_grace_left_s(job)
        if left_s > 0:
            return DeadlineCheck(job, retry_in_s=math.ceil(left_s))
        return DeadlineCheck(self._expire_unuploaded(job) or self.store.get(job.job_id))

    def _upload_grace_left_s(self, job: Job) -> float:
        """Seconds until the job's upload window and its grace are over (negative once they are)."""
        ends = job.upload_window_ends_at + dt.timedelta(seconds=self.upload_grace_s)
        return (ends - utcnow()).total_seconds()

    def _expire_unuploaded(self, job: Job) -> Job | None:
        """Expire a job still awaiting its upload; None when it left that state meanwhile (its upload was queued)."""
        window_s = round((job.upload_window_ends_at - job.created_at).total_seconds())
        return self.finish(
            job,
            JobStatus.EXPIRED,
            only_from={JobStatus.AWAITING_UPLOAD},
            error=f"the upload did not arrive within its {window_s}-second presign window",
        )

    # --- Dead letters ---------------------------------------------------------------------------------------------

    def dead_letter(self, body: str, receive_count: int) -> Job | None:
        """A claim check reached the DLQ: fail its job (if it is not final yet) and notify. None when its job is gone;
        NotAClaimCheck when the message is not a claim check."""
        try:
            claim = ClaimCheck.model_validate_json(body)
        except ValidationError as exc:
            message, _ = describe_validation_error(exc)
            raise NotAClaimCheck(message) from exc
        job = self.store.get(claim.job_id)
        if job is None:
            return None
        if job.status in FINAL_STATES:
            if not job.notified:
                self.notify(job)
            return job
        return self.finish(job, JobStatus.FAILED, error=f"dead-lettered after {receive_count} attempts")

    # --- Final states and notifications ---------------------------------------------------------------------------

    def finish(
        self,
        job: Job,
        target: JobStatus,
        *,
        result: ChatCompletion | None = None,
        only_from: frozenset[JobStatus] | set[JobStatus] | None = None,
        **fields: Any,
    ) -> Job | None:
        """Move a job to a final state (from ``only_from`` states, if given) and publish its notification; None when
        the move was not allowed."""
        finished = self.end(job, target, only_from=only_from, **fields)
        if finished is not None:
            self.notify(finished, result=result)
        return finished

    def end(
        self,
        job: Job | str,
        target: JobStatus,
        *,
        only_from: frozenset[JobStatus] | set[JobStatus] | None = None,
        **fields: Any,
    ) -> Job | None:
        """The state write of ``finish`` alone, marked not notified yet; the caller publishes (``notify_many``).
        ``job`` may be a job id: the write needs nothing else (a worker failing a job it never started)."""
        job_id = job if isinstance(job, str) else job.job_id
        if isinstance(fields.get("error"), str):
            fields["error"] = clip(fields["error"])  # it may quote the request: the record must fit DynamoDB
        return self.store.transition(job_id, target, only_from=only_from, notified=False, **fields)

    def store_result(self, job: Job, result: JobResult) -> tuple[JobResult, dict[str, Any]]:
        """Write the job's result object, once: the result that stands (an earlier run's, when one wrote first) and
        the fields its ``succeeded`` state records."""
        key = settings.result_key(job.tenant, job.job_id)
        written_at = utcnow()  # taken before the write: the expiry computed from it is never later than S3's
        stored = self.blobs.put_json_once(key, result.model_dump_json().encode())
        if stored is not None:
            # An earlier run of this job (a worker that crashed after writing) got there first: its result stands.
            result = type(result).model_validate_json(stored)
            written_at = self.blobs.written_at(key) or written_at
        expires_at = settings.lifecycle_expiry(written_at, self.payload_retention_days)
        if isinstance(result, EmbeddingList):  # no completion, no finish reason
            usage = Usage(prompt_tokens=result.usage.prompt_tokens, total_tokens=result.usage.total_tokens)
            return result, {"result_key": key, "usage": usage, "result_expires_at": expires_at}
        return result, {
            "result_key": key,
            "usage": result.usage,
            "finish_reason": result.choices[0].finish_reason,
            "result_expires_at": expires_at,
        }

    def notify_many(self, finished: list[tuple[Job, JobResult | None]]) -> list[bool]:
        """``notify`` for several jobs in batched requests (the worker's path at load); which ones went out."""
        notifications = [
            (build_notification(job, result=result, bucket=self.blobs.bucket), job.webhook is not None)
            for job, result in finished
        ]
        published = self.notifier.publish_batch(notifications)
        done = [job.job_id for (job, _), ok in zip(finished, published, strict=False) if ok]
        if done:
            self.store.mark_notified(done)
        return published

    def notify(self, job: Job, *, result: JobResult | None = None) -> None:
        """Publish the job's notification, then record that it was sent. A crash in between re-sends it on
        redelivery: subscribers see a notification at least once, and dedupe on job id."""
        notification = build_notification(job, result=result, bucket=self.blobs.bucket)
        self.notifier.publish(notification, has_webhook=job.webhook is not None)
        self.store.mark_notified([job.job_id])

    # --- The worker's side ----------------------------------------------------------------------------------------

    def lookup(self, job_id: str) -> Job | None:
        """A job as it stands, whoever's it is (the worker's read; the API reads through ``get``)."""
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

    def record_progress(self, job_id: str, progress: Any) -> bool:
        """Set a running job's tokens so far; False when it is no longer running."""
        return self.store.record_progress(job_id, progress)


def build_notification(job: Job, *, result: JobResult | None, bucket: str) -> ResultNotification:
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


def parse_request_body(
    body: bytes, endpoint: str | None = None
) -> tuple[ChatCompletionRequest | EmbeddingRequest | None, str]:
    """A stored request body as the request of ``endpoint`` (None: chat.completions; an embeddings job's
    ``/v1/embeddings``), or None and why it is not one (for a failed job's reason)."""
    try:
        safe_json.loads(body)  # the limits every entry point holds input to, with their message
    except safe_json.UnsafeJson as exc:
        return None, "the body is not valid JSON" if exc.msg.startswith("not valid") else f"the body is refused: {exc}"
    model: type[ChatCompletionRequest | EmbeddingRequest] = ChatCompletionRequest
    name = "chat.completions"
    if endpoint == EMBEDDINGS_ENDPOINT:
        model, name = EmbeddingRequest, "embeddings"
    try:
        return model.model_validate_json(body), ""
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            return None, "the body is not valid JSON"
        message, _ = describe_validation_error(exc)
        return None, f"the body is not a valid {name} request: {message}"
