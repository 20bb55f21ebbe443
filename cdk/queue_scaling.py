"""Queue-driven scaling of the worker service: out from zero on the first visible message, in to zero when idle."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

ONE_MINUTE = Duration.minutes(1)


class QueueScaling(Construct):
    """Two step-scaling policies on the service's desired count, each behind its own alarm.

    * Scale out: while ``ApproximateNumberOfMessagesVisible`` >= 1 (one minute, so the first message of an idle
      queue starts a task), add the tasks of the highest step reached. From zero, ECS managed scaling then launches
      the GPU instance the new task needs.
    * Scale in: only to zero, and only after ``idle_minutes`` consecutive minutes in which visible + in-flight
      (``ApproximateNumberOfMessagesNotVisible``) is 0. A message held by a worker is in flight, so a running job is
      never the reason for scale-in; task scale-in protection (set by the worker) covers the rest.

    SQS stops publishing metrics for a queue idle for hours and may take minutes to resume; a missing datapoint counts
    as "nothing to do" for scale-in and as "no work yet" for scale-out.

    :param service: the worker service.
    :param queue: the job queue.
    :param max_tasks: most worker tasks. Default: 2.
    :param scale_out_steps: (visible messages, tasks added) pairs, thresholds strictly increasing, the first 1.
        Default: ``((1, 1), (20, 2), (100, 4))``.
    :param idle_minutes: minutes with no visible and no in-flight message before scaling to zero. Default: 10.
    :param scale_out_cooldown: pause after a scale-out before the next adds more. Default: 5 minutes (a GPU instance
        boots, pulls the image and loads the model in about that time).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        service: ecs.BaseService,
        queue: sqs.IQueue,
        max_tasks: int = 2,
        scale_out_steps: Sequence[tuple[int, int]] = ((1, 1), (20, 2), (100, 4)),
        idle_minutes: int = 10,
        scale_out_cooldown: Duration = Duration.minutes(5),
    ) -> None:
        super().__init__(scope, id)
        validate_scale_out_steps(scale_out_steps)
        if idle_minutes < 1:
            raise ValueError(f"idle_minutes ({idle_minutes}) must be at least 1")
        stack = Stack.of(self)
        self.target = appscaling.ScalableTarget(
            self,
            "TaskCount",
            service_namespace=appscaling.ServiceNamespace.ECS,
            scalable_dimension="ecs:service:DesiredCount",
            resource_id=f"service/{service.cluster.cluster_name}/{service.service_name}",
            min_capacity=0,
            max_capacity=max_tasks,
            # The service-linked role Application Auto Scaling uses for ECS (what ecs.BaseService uses too).
            role=iam.Role.from_role_arn(
                self,
                "ScalingRole",
                stack.format_arn(
                    region="",
                    service="iam",
                    resource="role/aws-service-role/ecs.application-autoscaling.amazonaws.com",
                    resource_name="AWSServiceRoleForApplicationAutoScaling_ECSService",
                ),
            ),
        )

        visible = queue.metric_approximate_number_of_messages_visible(statistic="Maximum", period=ONE_MINUTE)
        in_flight = queue.metric_approximate_number_of_messages_not_visible(statistic="Maximum", period=ONE_MINUTE)
        first_threshold = scale_out_steps[0][0]
        self.scale_out_alarm = visible.create_alarm(
            self,
            "WorkVisible",
            alarm_description="Jobs are waiting: add worker tasks",
            threshold=first_threshold,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        scale_out = appscaling.StepScalingAction(
            self,
            "ScaleOut",
            scaling_target=self.target,
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            metric_aggregation_type=appscaling.MetricAggregationType.MAXIMUM,
            cooldown=scale_out_cooldown,
        )
        # Step bounds are relative to the alarm threshold.
        for index, (threshold, tasks) in enumerate(scale_out_steps):
            upper = scale_out_steps[index + 1][0] - first_threshold if index + 1 < len(scale_out_steps) else None
            scale_out.add_adjustment(adjustment=tasks, lower_bound=threshold - first_threshold, upper_bound=upper)
        self.scale_out_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(scale_out))

        self.outstanding = cloudwatch.MathExpression(
            expression="visible + inFlight",
            using_metrics={"visible": visible, "inFlight": in_flight},
            label="Jobs visible or in flight",
            period=ONE_MINUTE,
        )
        self.scale_in_alarm = self.outstanding.create_alarm(
            self,
            "Idle",
            alarm_description=f"No job visible or in flight for {idle_minutes} minutes: scale workers to zero",
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=idle_minutes,
            datapoints_to_alarm=idle_minutes,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        scale_in = appscaling.StepScalingAction(
            self,
            "ScaleInToZero",
            scaling_target=self.target,
            adjustment_type=appscaling.AdjustmentType.EXACT_CAPACITY,
            metric_aggregation_type=appscaling.MetricAggregationType.MAXIMUM,
        )
        scale_in.add_adjustment(adjustment=0, upper_bound=0)
        self.scale_in_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(scale_in))


def validate_scale_out_steps(steps: Sequence[tuple[int, int]]) -> None:
    """Reject steps that could not express "out from zero on the first message, more as the backlog grows"."""
    if not steps:
        raise ValueError("scale_out_steps is empty: the service could never scale out from zero")
    thresholds = [threshold for threshold, _ in steps]
    if thresholds[0] != 1:
        raise ValueError(f"scale_out_steps must start at 1 visible message to scale out from zero, got {thresholds[0]}")
    if any(b <= a for a, b in zip(thresholds, thresholds[1:])):
        raise ValueError(f"scale_out_steps thresholds {thresholds} must be strictly increasing")
    if any(tasks < 1 for _, tasks in steps):
        raise ValueError(f"scale_out_steps must each add at least one task, got {list(steps)}")
