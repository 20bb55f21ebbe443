"""Monitoring: alarms on dead letters and queue age, and one dashboard for the whole pipeline."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings

FIVE_MINUTES = Duration.minutes(5)


def worker_metric(name: str, statistic: str, label: str) -> cloudwatch.MathExpression:
    """A worker metric summed over whatever dimensions the worker's EMF records carry (SEARCH finds them all)."""
    search = f"SEARCH('{{{settings.METRICS_NAMESPACE}}} MetricName=\"{name}\"', '{statistic}', 300)"
    return cloudwatch.MathExpression(
        expression=f"SUM({search})" if statistic == "Sum" else f"AVG({search})", label=label, period=FIVE_MINUTES
    )


class Monitoring(Construct):
    """Alarms when any dead-letter queue holds a message or the oldest job waits too long, and a dashboard.

    :param queue: the job queue.
    :param dead_letter_queues: name -> DLQ to alarm on (depth > 0).
    :param service: the worker service (running task count).
    :param oldest_message_alarm_age: alarm when the oldest queued job is older than this. Default: 15 minutes.
    :param alarm_topic: where alarms notify. Default: none (alarms only show in CloudWatch).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        queue: sqs.IQueue,
        dead_letter_queues: Mapping[str, sqs.IQueue],
        service: ecs.BaseService,
        oldest_message_alarm_age: Duration = Duration.minutes(15),
        alarm_topic: sns.ITopic | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for name, dlq in dead_letter_queues.items():
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
        oldest = queue.metric_approximate_age_of_oldest_message(statistic="Maximum", period=Duration.minutes(1))
        self.alarms["OldestJob"] = oldest.create_alarm(
            self,
            "OldestJobTooOld",
            alarm_description=f"A job has waited over {oldest_message_alarm_age.to_seconds()} s for a worker",
            threshold=oldest_message_alarm_age.to_seconds(),
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=3,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        if alarm_topic is not None:
            for alarm in self.alarms.values():
                alarm.add_alarm_action(cw_actions.SnsAction(alarm_topic))

        running_tasks = cloudwatch.Metric(
            namespace="ECS/ContainerInsights",
            metric_name="RunningTaskCount",
            dimensions_map={"ClusterName": service.cluster.cluster_name, "ServiceName": service.service_name},
            statistic="Average",
            period=Duration.minutes(1),
        )
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue depth and in-flight jobs",
                left=[
                    queue.metric_approximate_number_of_messages_visible(
                        statistic="Maximum", period=Duration.minutes(1)
                    ),
                    queue.metric_approximate_number_of_messages_not_visible(
                        statistic="Maximum", period=Duration.minutes(1)
                    ),
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(title="Age of oldest job (s)", left=[oldest], width=8),
            cloudwatch.GraphWidget(title="Running worker tasks", left=[running_tasks], width=8),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Jobs succeeded / failed",
                left=[
                    worker_metric(settings.METRIC_JOBS_SUCCEEDED, "Sum", "Succeeded"),
                    worker_metric(settings.METRIC_JOBS_FAILED, "Sum", "Failed"),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Processing time (s)",
                left=[worker_metric(settings.METRIC_PROCESSING_TIME, "Average", "Average processing time")],
                width=12,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=24)
        )
