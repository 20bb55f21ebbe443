"""Wake the workers from zero: when a job is queued and the worker service wants no task, ask for one at once.

The scaling alarms (cdk/queue_scaling.py) start a task too, but only once SQS has published a minute of metrics and
an alarm has evaluated them: one to three minutes, plus however long SQS takes to publish again for a queue that sat
idle for hours. A DescribeServices and an UpdateService take a fraction of a second.

One check per ``check_interval_s`` per process (a Lambda execution environment): a burst of jobs costs one
DescribeServices, and one UpdateService if the desired count was 0. Environments racing each other each set the count
to 1, never add to it. A failed check never fails the job that triggered it: the job is already queued, the failure is
logged and counted (``settings.METRIC_WAKE_FAILURES``), and the alarms wake the service as they would without this.

The hold (``hold_s``): a wake also keeps the service's scaling minimum at 1 for ``hold_s``. CloudWatch re-runs an
alarm's Auto Scaling actions every minute the alarm stays in ALARM; the keep-alive alarm, in ALARM while the service
sat idle, would set the count back to 0 the next minute, before SQS has published the job's minute. A minimum of 1
makes that scale-to-zero a no-op until the hold ends (a scheduled action puts the minimum back to 0).

With ``hold_max_tasks`` and ``max_tasks`` (the stack sets them for a fleet whose warm pool holds fewer instances than
its most tasks) the hold also keeps the maximum at ``hold_max_tasks``, the tasks the pool can start (one per pooled
instance), and its end puts it back to ``max_tasks``. A task beyond those would start on a fresh instance (boot, image
pull and weights: about 8.6 minutes to serve in docs/scaling.md) when the pool's replacement, ready about when the
hold ends, serves it as soon; and the first task has usually cleared the burst that woke it by then (on the
conversation trace that fresh instance was paid 9.5 minutes and never served a job). A backlog that outlasts the hold
still gets its task: the scale-out alarm, in ALARM, re-runs its action every minute, and the first run after the
hold's end adds it.

The instance (``group``): a task needs a GPU instance, and from an idle stack there is none. ECS managed scaling would
launch one after its next CapacityProviderReservation datapoint (one a minute, ECS Developer Guide, "Amazon ECS
cluster auto scaling"); a wake that set the service from 0 also raises the GPU Auto Scaling group's desired capacity
from 0 to 1 (SetDesiredCapacity), so the instance starts (from the warm pool when there is one) within the second.
Managed scaling then adds no second instance: its scale-out is blocked while any instance is within the capacity
provider's instanceWarmupPeriod (ECS Developer Guide, managed scale-out behaviour), and it scales in only after 15
datapoints below its target, never an instance that runs a task (managed termination protection). A failed start is logged and counted; managed scaling starts the instance a minute later.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import time
from collections.abc import Callable

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from async_inference import settings
from async_inference.aws import CapacityGroup, WorkerService
from async_inference.config import ENV_METRICS_NAMESPACE, WakeTarget

logger = logging.getLogger("async_inference.wake")


class ServiceWaker:
    """Sets ``service``'s desired count to 1 when it is 0, checking at most once per ``check_interval_s``, holds
    its scaling minimum at 1 for ``hold_s`` after a wake (none when 0; with ``hold_max_tasks`` and ``max_tasks`` its
    maximum at ``hold_max_tasks``, put back to ``max_tasks`` when the hold ends), and raises ``group`` (the GPU Auto
    Scaling group, when given) from 0 instances to 1."""

    def __init__(
        self,
        service: WorkerService,
        *,
        check_interval_s: float,
        hold_s: float = 0.0,
        group: CapacityGroup | None = None,
        max_tasks: int | None = None,
        hold_max_tasks: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        utcnow: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.service = service
        self.check_interval_s = check_interval_s
        self.hold_s = hold_s
        self.group = group
        self.max_tasks = max_tasks
        self.hold_max_tasks = hold_max_tasks
        self._clock = clock
        self._utcnow = utcnow
        self._next_check = -math.inf
        self.checks = 0
        self.wakes = 0
        self.failures = 0
        self.instance_starts = 0

    @classmethod
    def for_target(cls, target: WakeTarget) -> ServiceWaker:
        return cls(
            WorkerService(target.cluster, target.service),
            check_interval_s=target.check_interval_s,
            hold_s=target.hold_s,
            group=CapacityGroup(target.group) if target.group else None,
            max_tasks=target.max_tasks,
            hold_max_tasks=target.hold_max_tasks,
        )

    def job_queued(self) -> bool:
        """A job was queued: wake the service if this process has not looked for ``check_interval_s``. True when
        this call set the desired count from 0 to 1. Never raises."""
        now = self._clock()
        if now < self._next_check:
            return False
        # The next check waits out the interval whatever this one finds, so that a failing ECS is asked once a
        # minute, not once a job.
        self._next_check = now + self.check_interval_s
        self.checks += 1
        try:
            if self.service.desired_count() != 0:
                return False
            self.service.set_desired_count(1)
        except Exception as exc:  # the job is queued already: nothing here may cost it
            self.failures += 1
            logger.warning(
                "could not wake the worker service %s (%s); the scaling alarms will", self.service.service, exc
            )
            _count_failure()
            return False
        self.wakes += 1
        logger.info("woke the worker service %s from zero", self.service.service)
        self._start_instance()
        self._hold()
        return True

    def _start_instance(self) -> None:
        """Raise the GPU group from 0 to 1 instance, before the hold: the instance's start is the long step of a wake.
        A group above 0 is left alone; a failure is logged and counted, and managed scaling starts one instead."""
        if self.group is None:
            return
        try:
            if self.group.desired_capacity() != 0:
                return
            self.group.set_desired_capacity(1)
        except Exception as exc:
            self.failures += 1
            logger.warning(
                "woke the worker service %s but could not start a GPU instance in %s (%s); ECS managed scaling will",
                self.service.service,
                self.group.name,
                exc,
            )
            _count_failure()
            return
        self.instance_starts += 1
        logger.info("started a GPU instance in %s", self.group.name)

    def _hold(self) -> None:
        """Hold the service's minimum at one task for ``hold_s`` (and its maximum at ``hold_max_tasks``); a failure is
        logged and counted, and the wake stands."""
        if self.hold_s <= 0:
            return
        try:
            self.service.hold(
                release_at=self._utcnow() + dt.timedelta(seconds=self.hold_s),
                maximum=self.hold_max_tasks,
                restore_max=self.max_tasks,
            )
        except Exception as exc:
            self.failures += 1
            logger.warning(
                "woke the worker service %s but could not hold its scaling bounds (%s)", self.service.service, exc
            )
            _count_failure()


def _count_failure() -> None:
    """One EMF record, printed at once: the wake runs deep inside a submit, outside the handler's metric batch."""
    namespace = os.environ.get(ENV_METRICS_NAMESPACE) or settings.METRICS_NAMESPACE
    with single_metric(name=settings.METRIC_WAKE_FAILURES, unit=MetricUnit.Count, value=1, namespace=namespace):
        pass
