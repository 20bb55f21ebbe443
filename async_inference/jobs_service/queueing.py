"""How an accepted job reaches its model's fleet: the fleet's job queue or batch lane, and a wake of its workers."""

from __future__ import annotations

from collections.abc import Mapping

from async_inference.aws import JobQueue, JobStore
from async_inference.config import WakeSettings
from async_inference.fleets import FleetRoute, route_of
from async_inference.jobs import JobStatus
from async_inference.jobs_service.outcomes import JobOutcomes
from async_inference.jobs_service.shared import ErrorKind, ServiceError
from async_inference.schemas import Job
from async_inference.wake import ServiceWaker


class JobQueues:
    """Each model's route (async_inference.fleets) made into its queues and waker, once per model."""

    def __init__(
        self,
        *,
        store: JobStore,
        outcomes: JobOutcomes,
        fleets: Mapping[str, FleetRoute] | None = None,
        wake: WakeSettings | None = None,
    ) -> None:
        self.store = store
        self.outcomes = outcomes
        # The only way to a queue: a model without a route is not served. None: no job is queued (a worker's
        # service, which takes jobs from its own queue).
        self.fleets = dict(fleets or {})
        # None: queueing a job wakes nothing (the scaling alarms still start a task).
        self._wake = wake
        self._routed: dict[str, tuple[JobQueue, JobQueue | None, ServiceWaker | None]] = {}

    def has_lane(self, model: str | None) -> bool:
        """Whether ``model``'s fleet has a batch lane (None, a model named only at upload: whether any fleet has)."""
        if model is None:
            return any(route.batch_queue_url for route in self.fleets.values())
        route = route_of(self.fleets, model)
        return route is not None and route.batch_queue_url is not None

    def route(self, model: str) -> tuple[JobQueue, JobQueue | None, ServiceWaker | None]:
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

    def enqueue(self, job: Job) -> None:
        """Send the job's claim check to its fleet and wake the fleet; 503 (the job failed) when the queue refuses."""
        # A job that reached the batch lane's priority before this function had a lane (a stale configuration) still
        # runs, on the job queue: queued in the wrong lane beats never queued.
        assert job.model is not None, "a queued job names its model (at submit, or when its upload is accepted)"
        queue, lane, waker = self.route(job.model)
        queue = lane if job.priority == "batch" and lane is not None else queue
        try:
            queue.send(job.claim_check())
        except Exception as exc:
            # The job was accepted into the table but could not be queued: end it with a reason rather than leave it
            # queued forever, and let the client retry.
            failed = self.store.transition(job.job_id, JobStatus.FAILED, error=f"could not enqueue the job: {exc}")
            if failed is not None:
                self.outcomes.notify(failed)
            raise ServiceError(
                ErrorKind.UNAVAILABLE, "unavailable", "the job queue is unavailable; retry the request"
            ) from exc
        if waker is not None:
            waker.job_queued()  # never raises: the job is queued whatever the wake finds
