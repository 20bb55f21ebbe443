"""An upload job's request landing in S3: checked, moved out of the presigned URL's reach and queued, or the job
failed with the reason."""

from __future__ import annotations

from async_inference import settings
from async_inference.aws import Blobs, JobStore, PayloadTooLarge
from async_inference.fleets import kind_of_endpoint
from async_inference.jobs import JobStatus
from async_inference.jobs_service.outcomes import JobOutcomes
from async_inference.jobs_service.queueing import JobQueues
from async_inference.jobs_service.shared import ModelChecks, ServiceError, parse_request_body
from async_inference.schemas import CHAT_ENDPOINT, ChatCompletionRequest, EmbeddingRequest, Job, engine_rows, utcnow


class UploadIntake:
    """The upload function's side: one S3 event per object under the upload prefix."""

    def __init__(
        self, *, store: JobStore, blobs: Blobs, models: ModelChecks, queues: JobQueues, outcomes: JobOutcomes
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.models = models
        self.queues = queues
        self.outcomes = outcomes

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
                job,
                self.outcomes.finish(
                    job, JobStatus.FAILED, only_from=only_awaiting, error=f"upload rejected: {reason}"
                ),
            )
        kind = kind_of_endpoint(job.endpoint or CHAT_ENDPOINT)
        if (problem := self.models.model_problem(request.model, kind)) is not None:
            _, code, message = problem
            return self._settled(
                job,
                self.outcomes.finish(
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
                self.outcomes.finish(
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
        self.queues.enqueue(job)
        self.store.update(job.job_id, claim_sent_at=utcnow())

    def _check_upload(
        self, job: Job, key: str, size_bytes: int
    ) -> tuple[ChatCompletionRequest | EmbeddingRequest | None, bytes, str]:
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
            self.models.check_limits(job.tenant, request)
        except ServiceError as exc:
            return None, body, f"{exc.code}: {exc.message}"
        return request, body, reason
