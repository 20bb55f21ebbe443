"""What the service does with a job, independent of how the request arrived, one side per module.

Handlers are thin adapters over these sides; they talk to AWS only through the adapters in ``aws.py``:
- ``api``: ``JobApi``, a tenant's jobs as the API submits, reads, lists, cancels and deletes them;
- ``uploads``: ``UploadIntake``, an upload job's request landing in S3;
- ``deadlines``: ``UploadDeadlineWatch``, an upload job whose upload never came;
- ``dead_letters``: ``DeadLetters``, a claim check that reached a dead-letter queue;
- ``outcomes``: ``JobOutcomes``, a job's final state, result and notification, for every side;
- ``worker``: ``WorkerJobs``, what a GPU worker reads and writes of the jobs it runs;
- ``queueing`` (``JobQueues``) and ``shared`` (``ModelChecks``, ``ServiceError``): what the sides share.

``JobService`` composes them over one set of adapters for a process; each function uses the side it serves.
"""

from __future__ import annotations

from collections.abc import Mapping

from async_inference import settings
from async_inference.aws import Blobs, JobQueue, JobStore, Notifier, UploadDeadlines
from async_inference.config import ServiceConfig, WakeSettings
from async_inference.fleets import FleetRoute
from async_inference.jobs_service.api import JobApi, Submitted, poll_after_s
from async_inference.jobs_service.dead_letters import DeadLetters
from async_inference.jobs_service.deadlines import DeadlineCheck, UploadDeadlineWatch
from async_inference.jobs_service.outcomes import JobOutcomes, build_notification
from async_inference.jobs_service.queueing import JobQueues
from async_inference.jobs_service.shared import (
    ErrorKind,
    JobResult,
    ModelChecks,
    NotAClaimCheck,
    ServiceError,
    describe_validation_error,
    parse_request_body,
)
from async_inference.jobs_service.uploads import UploadIntake
from async_inference.jobs_service.worker import WorkerJobs
from async_inference.limits import RequestLimits
from async_inference.quotas import TenantQuota
from async_inference.served_models import ServedModels

__all__ = [
    "DeadLetters",
    "DeadlineCheck",
    "ErrorKind",
    "JobApi",
    "JobOutcomes",
    "JobQueues",
    "JobResult",
    "JobService",
    "ModelChecks",
    "NotAClaimCheck",
    "ServiceError",
    "Submitted",
    "UploadDeadlineWatch",
    "UploadIntake",
    "WorkerJobs",
    "build_notification",
    "describe_validation_error",
    "parse_request_body",
    "poll_after_s",
]


class JobService:
    """The job service's sides over one set of adapters (``store``, ``blobs``, ``notifier``; ``queue``: a worker's
    own job queue, None in the functions, which queue by route)."""

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
        self.blobs = blobs
        self.notifier = notifier
        self.queue = queue
        self.models = ModelChecks(served=served, fleets=fleets, limits=limits, quotas=quotas)
        self.outcomes = JobOutcomes(
            store=store, blobs=blobs, notifier=notifier, payload_retention_days=payload_retention_days
        )
        self.queues = JobQueues(store=store, outcomes=self.outcomes, fleets=fleets, wake=wake)
        self.deadlines = UploadDeadlineWatch(
            store=store, outcomes=self.outcomes, deadlines=deadlines, upload_grace_s=upload_grace_s
        )
        self.api = JobApi(
            store=store,
            blobs=blobs,
            models=self.models,
            queues=self.queues,
            deadlines=self.deadlines,
            outcomes=self.outcomes,
            allow_local_webhooks=allow_local_webhooks,
            idempotency_in_progress_s=idempotency_in_progress_s,
        )
        self.uploads = UploadIntake(
            store=store, blobs=blobs, models=self.models, queues=self.queues, outcomes=self.outcomes
        )
        self.dead_letters = DeadLetters(store=store, outcomes=self.outcomes)
        self.worker = WorkerJobs(store=store, blobs=blobs)

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
