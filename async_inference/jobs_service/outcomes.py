"""How a job ends: its final state written, its result stored once, its notification published."""

from __future__ import annotations

from typing import Any

from async_inference import settings
from async_inference.aws import Blobs, JobStore, Notifier
from async_inference.jobs import JobStatus
from async_inference.jobs_service.shared import JobResult
from async_inference.limits import clip
from async_inference.schemas import (
    ChatCompletion,
    EmbeddingList,
    Job,
    ResultNotification,
    S3Location,
    Timings,
    Usage,
    utcnow,
)


class JobOutcomes:
    """Final states and notifications, for every side that ends a job (the API's cancel, an upload refused or
    expired, a dead letter, the worker)."""

    def __init__(
        self,
        *,
        store: JobStore,
        blobs: Blobs,
        notifier: Notifier,
        payload_retention_days: int = settings.PAYLOAD_RETENTION_DAYS,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.notifier = notifier
        self.payload_retention_days = payload_retention_days

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
