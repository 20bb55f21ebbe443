"""The worker's CloudWatch metrics: EMF records on stdout through Powertools Metrics, which the container's awslogs
driver ships to CloudWatch Logs, where they become metrics (as the Lambdas' do).

Every name in ``settings.WORKER_METRICS`` is recorded here (units and meanings are in ``async_inference.settings``). The
namespace is ``POWERTOOLS_METRICS_NAMESPACE`` (default ``settings.METRICS_NAMESPACE``), the ``service`` dimension
``POWERTOOLS_SERVICE_NAME``; ``POWERTOOLS_METRICS_DISABLED=true`` records nothing. The worker flushes at each heartbeat
and at exit: the record is built on the event loop (microseconds) and written from an I/O thread, so a slow stdout
reader never stalls the loop.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.functions import is_metrics_disabled

from async_inference import settings


class WorkerMetrics:
    """What the worker measures, by job; ``enabled=False`` (tests, benchmarks in-process) records nothing."""

    def __init__(self, namespace: str = settings.METRICS_NAMESPACE, *, enabled: bool = True) -> None:
        self._enabled = enabled and not is_metrics_disabled()
        self._metrics = Metrics(namespace=namespace)

    def started(self, queue_s: float) -> None:
        """A job's generation started ``queue_s`` after its submission."""
        self._add(settings.METRIC_QUEUE_TIME, MetricUnit.Seconds, queue_s)

    def succeeded(self, *, processing_s: float, completion_tokens: int) -> None:
        """A job ended succeeded, its result stored ``processing_s`` after its generation started."""
        self._add(settings.METRIC_JOBS_SUCCEEDED, MetricUnit.Count, 1)
        self._add(settings.METRIC_PROCESSING_TIME, MetricUnit.Seconds, processing_s)
        self._add(settings.METRIC_COMPLETION_TOKENS, MetricUnit.Count, completion_tokens)

    def failed(self) -> None:
        self._add(settings.METRIC_JOBS_FAILED, MetricUnit.Count, 1)

    def _add(self, name: str, unit: MetricUnit, value: float) -> None:
        if self._enabled:
            # Powertools prints a record by itself when a metric reaches 100 values: between two heartbeats at most.
            self._metrics.add_metric(name=name, unit=unit, value=value)

    def take_record(self) -> str | None:
        """The EMF record of everything measured since the last one, as a line of JSON; None when nothing was."""
        if not self._enabled or not self._metrics.metric_set:
            return None
        record: dict[str, Any] = dict(self._metrics.serialize_metric_set())
        self._metrics.clear_metrics()
        return json.dumps(record, separators=(",", ":"))

    @staticmethod
    def write(record: str) -> None:
        """Write a record to stdout, where the log driver picks it up (blocking: call it from an I/O thread)."""
        sys.stdout.write(record + "\n")
        sys.stdout.flush()

    def flush(self) -> None:
        """Write what was measured now, from the calling thread (at exit)."""
        record = self.take_record()
        if record is not None:
            self.write(record)
