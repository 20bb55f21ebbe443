"""Monitoring: alarms on dead letters and queue age, and one dashboard for the whole pipeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings
from cdk.dead_letter_handler import DEAD_LETTER_SERVICE_NAME
from cdk.operations_alarms import OperationsAlarms

FIVE_MINUTES = Duration.minutes(5)

# How the dashboard plots each metric of settings.WORKER_METRICS, API_METRICS and DEAD_LETTER_METRICS: its widget and
# statistics.
# Counts are summed per period; times are seconds, shown as the mean and the 90th percentile (the tail a client waits).
_JOBS = "Jobs per 5 minutes"
_TIMES = "Queue and processing time (s)"
_TOKENS = "Completion tokens per 5 minutes"
_WAKE = "Failed wakes from zero per 5 minutes"
_DEAD_LETTERS = "Job DLQ messages that are not claim checks (receives per 5 minutes)"
METRIC_PLOTS: dict[str, tuple[str, tuple[str, ...]]] = {
    settings.METRIC_JOBS_SUBMITTED: (_JOBS, ("Sum",)),
    settings.METRIC_JOBS_SUCCEEDED: (_JOBS, ("Sum",)),
    settings.METRIC_JOBS_FAILED: (_JOBS, ("Sum",)),
    settings.METRIC_QUEUE_TIME: (_TIMES, ("Average", "p90")),
    settings.METRIC_PROCESSING_TIME: (_TIMES, ("Average", "p90")),
    settings.METRIC_COMPLETION_TOKENS: (_TOKENS, ("Sum",)),
    settings.METRIC_WAKE_FAILURES: (_WAKE, ("Sum",)),
    settings.METRIC_DEAD_LETTERS_UNPROCESSABLE: (_DEAD_LETTERS, ("Sum",)),
}


def service_metric(name: str, service_name: str, statistic: str) -> cloudwatch.Metric:
    """A metric the service emits through Powertools Metrics (EMF): the shared namespace, dimension ``service``."""
    return cloudwatch.Metric(
        namespace=settings.METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"service": service_name},
        statistic=statistic,
        period=FIVE_MINUTES,
        label=f"{name} ({statistic})" if statistic != "Sum" else name,
    )


@dataclass(frozen=True)
class MonitoredFleet:
    """A model's fleet: its job queue (an age alarm of its own, its depth on the dashboard), its worker service
    (running tasks) and its dead-letter queues (name -> DLQ, an alarm each). ``key`` suffixes its age alarm's id
    (``cdk.model_fleet.deployed_names``: the ids each fleet was deployed with)."""

    model: str
    key: str
    queue: sqs.IQueue
    service: ecs.BaseService
    dead_letter_queues: Mapping[str, sqs.IQueue] = field(default_factory=dict)


class Monitoring(Construct):
    """Alarms when any dead-letter queue holds a message or the oldest job of any model's queue waits too long, and a
    dashboard: a row of queue depth, oldest job and running tasks per model's fleet, then the service's metrics.

    :param dead_letter_queues: name -> DLQ of the shared resources to alarm on (depth > 0).
    :param fleets: every model's fleet, each with its own age and dead-letter alarms and dashboard row.
    :param worker_service_name: the worker's Powertools service name (the ``service`` dimension of its metrics).
    :param api_service_name: the API function's Powertools service name.
    :param dead_letter_service_name: the DLQ function's Powertools service name. Default:
        ``cdk.dead_letter_handler.DEAD_LETTER_SERVICE_NAME``.
    :param oldest_message_alarm_age: alarm when the oldest queued job is older than this. Default: 15 minutes.
    :param alarm_topic: where alarms notify. Default: a topic of the stack's own (``cdk.operations_alarms``).
    :param alarm_email: an address subscribed to the alarm topic. Default: none.
    :param log_retention: retention of the log groups made for CDK's own functions. Default: one month.

    Made last: ``operations`` (``cdk.operations_alarms.OperationsAlarms``) finds the stack's functions, APIs and GPU
    fleets when it is made, alarms on each, and gives every alarm without an action the topic.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        dead_letter_queues: Mapping[str, sqs.IQueue],
        fleets: Sequence[MonitoredFleet],
        worker_service_name: str,
        api_service_name: str,
        dead_letter_service_name: str = DEAD_LETTER_SERVICE_NAME,
        oldest_message_alarm_age: Duration = Duration.minutes(15),
        alarm_topic: sns.ITopic | None = None,
        alarm_email: str | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        self.operations = OperationsAlarms(
            self, "Operations", alarm_topic=alarm_topic, alarm_email=alarm_email, log_retention=log_retention
        )
        self.alarm_topic = self.operations.topic
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        if not fleets:
            raise ValueError("Monitoring needs at least one model's fleet")
        fleet_dead_letters = {name: dlq for fleet in fleets for name, dlq in fleet.dead_letter_queues.items()}
        for name, dlq in {**dead_letter_queues, **fleet_dead_letters}.items():
            self.alarms[name] = dlq.metric_approximate_number_of_messages_visible(
                statistic="Maximum", period=Duration.minutes(1)
            ).create_alarm(
                self,
                f"{name}NotEmpty",
                alarm_description=f"{name} holds messages that exhausted their retries",
                threshold=0,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
        age = oldest_message_alarm_age.to_seconds()
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        for fleet in fleets:
            oldest = fleet.queue.metric_approximate_age_of_oldest_message(
                statistic="Maximum", period=Duration.minutes(1)
            )
            self.alarms[f"OldestJob{fleet.key}"] = oldest.create_alarm(
                self,
                f"OldestJobTooOld{fleet.key}",
                alarm_description=f"A job of {fleet.model} has waited over {age} s for a worker",
                threshold=age,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=3,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            self.dashboard.add_widgets(*self._fleet_widgets(fleet, oldest))
        for alarm in self.alarms.values():
            alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        self.dashboard.add_widgets(
            *self._service_metric_widgets(worker_service_name, api_service_name, dead_letter_service_name)
        )
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(
                title="Alarms", alarms=[*self.alarms.values(), *self.operations.alarms.values()], width=24
            )
        )

    @staticmethod
    def _fleet_widgets(fleet: MonitoredFleet, oldest: cloudwatch.IMetric) -> list[cloudwatch.GraphWidget]:
        """One fleet's row: its queue's depth and in-flight jobs, its oldest job's age, its running worker tasks."""
        prefix = f"{fleet.model}: "
        running_tasks = cloudwatch.Metric(
            namespace="ECS/ContainerInsights",
            metric_name="RunningTaskCount",
            dimensions_map={
                "ClusterName": fleet.service.cluster.cluster_name,
                "ServiceName": fleet.service.service_name,
            },
            statistic="Average",
            period=Duration.minutes(1),
        )
        depth = [
            fleet.queue.metric_approximate_number_of_messages_visible(statistic="Maximum", period=Duration.minutes(1)),
            fleet.queue.metric_approximate_number_of_messages_not_visible(
                statistic="Maximum", period=Duration.minutes(1)
            ),
        ]
        return [
            cloudwatch.GraphWidget(title=f"{prefix}Queue depth and in-flight jobs", left=depth, width=8),
            cloudwatch.GraphWidget(title=f"{prefix}Age of oldest job (s)", left=[oldest], width=8),
            cloudwatch.GraphWidget(title=f"{prefix}Running worker tasks", left=[running_tasks], width=8),
        ]

    @staticmethod
    def _service_metric_widgets(
        worker_service_name: str, api_service_name: str, dead_letter_service_name: str = DEAD_LETTER_SERVICE_NAME
    ) -> list[cloudwatch.GraphWidget]:
        """One graph per METRIC_PLOTS widget, holding every name of the shared metric lists; a name without a plot
        is refused, so a metric added to settings cannot miss the dashboard."""
        emitted = {name: worker_service_name for name in settings.WORKER_METRICS}
        emitted.update({name: api_service_name for name in settings.API_METRICS})
        emitted.update({name: dead_letter_service_name for name in settings.DEAD_LETTER_METRICS})
        unplotted = sorted(set(emitted) - set(METRIC_PLOTS))
        if unplotted:
            raise ValueError(f"metrics {unplotted} are in settings but have no plot in cdk.monitoring.METRIC_PLOTS")
        widgets: dict[str, list[cloudwatch.IMetric]] = {}
        for name, (title, statistics) in METRIC_PLOTS.items():
            if name in emitted:
                widgets.setdefault(title, []).extend(
                    service_metric(name, emitted[name], statistic) for statistic in statistics
                )
        return [cloudwatch.GraphWidget(title=title, left=metrics, width=8) for title, metrics in widgets.items()]
