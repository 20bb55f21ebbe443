"""Queue-driven scaling of the worker service: woken at once (and held up for a few minutes), out to what the backlog
needs, in one task at a time, to zero after a keep-alive that only published idleness ends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Duration, Stack, Token
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference.config import DEFAULT_WAKE_CHECK_INTERVAL_S, DEFAULT_WAKE_HOLD_S, WakeTarget
from async_inference.keep_alive import KeepAlivePolicy
from cdk.keep_alive import LearnedKeepAlive
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge

ONE_MINUTE = Duration.minutes(1)
# The default jobs a task is sized for, in batches (max_num_seqs): one batch, the same per-instance capacity the tuned
# anchors target, so a second task is asked for as soon as jobs wait beyond what one task runs. Chosen by simulating
# the Azure conversation trace on the calibrated engine (docs/scaling.md): 1.5 batches (the phase-1 choice, on the
# uncalibrated engine) saves 0.13 GPU hours but lets the p95 wait after the first 15 minutes reach 1.8 s, where every
# tuned anchor's is at most that; 2 batches cost more at 16 sequences.
JOBS_PER_TASK_IN_BATCHES = 1.0
# CloudWatch takes at most 10 metrics in one metric math alarm; the keep-alive alarm reads three per queue and the
# learned keep-alive's decision.
MAX_ALARM_METRICS = 10
METRICS_PER_QUEUE = 3


@dataclass(frozen=True)
class CountedQueue:
    """A queue whose messages are work for the workers, and how much each is worth.

    :param queue: the queue; its visible and in-flight messages are backlog, and a message sent to it restarts the
        keep-alive.
    :param weight: jobs of a task's ``jobs_per_task`` one message stands for. Default: 1 (one message, one job).
    """

    queue: sqs.IQueue
    weight: float = 1.0


class QueueScaling(Construct):
    """The worker service's desired count, from its queues' backlog, on three alarms and a wake call.

    Backlog ``b`` = sum over ``queues`` of weight x (ApproximateNumberOfMessagesVisible +
    ApproximateNumberOfMessagesNotVisible), Maximum over one minute; ``desired`` = Container Insights'
    DesiredTaskCount of the service (``FILL(desired, 0)``: Container Insights publishes nothing for a service without
    tasks). ``J`` = ``jobs_per_task``.

    * Wake (``grant_wake``): the function that queues a job sets the desired count to 1 when it is 0, at once and
      without CloudWatch (``async_inference.wake``); the alarms below would take 1 to 3 minutes. It also holds the
      scalable target's minimum at 1 for ``wake_hold`` (RegisterScalableTarget, with a scheduled action that puts the
      minimum back to 0 first): CloudWatch re-runs an alarm's Auto Scaling actions every minute the alarm stays in
      ALARM, so an ``Idle`` alarm still in ALARM from before the job (its datapoints of the job's minute not yet
      published) would otherwise set the count straight back to 0. With ``wake_hold_maximum`` the hold keeps the
      maximum there as well (put back to ``max_tasks`` by the same scheduled action): a task beyond what the warm
      pool can start, asked for while the first still starts, would start on a fresh instance rather than from the
      pool's replacement, and usually after the first has cleared the burst that woke it (docs/scaling.md); a backlog
      that outlasts the hold gets it from ``TasksShort``, which re-runs its action every minute in ALARM.
      (``cdk.gpu_capacity.GpuCapacity.grant_instance_start`` lets the same function start the GPU instance too,
      skipping ECS managed scaling's minute.)
    * ``TasksShort`` (scale-out): ``n = CEIL(b / J)``; when ``n - desired >= 1`` for one minute (missing data not
      breaching), the count is *set* to ``n`` (ExactCapacity, one step per count up to ``max_tasks``). Setting rather
      than adding makes the result independent of whether Container Insights has published the desired count yet:
      while the only task still starts there may be no DesiredTaskCount (it comes from the ECS agent of an instance
      that runs a task), ``desired`` reads 0, and an added shortfall would ask for a second task the backlog does not
      need.
    * ``TasksSpare`` (step-down): ``desired - MAX(CEIL(b / (J x scale_in_fill)), 1) >= 1`` for
      ``scale_in_minutes``, missing data ``missing``, removes one task; never below one (``Idle`` takes the last).
    * ``Idle`` (keep-alive): ``visible + in flight + NumberOfMessagesSent (Sum)`` over every queue ``<= 0`` for
      ``keep_alive_minutes``, sets the count to 0. Only published zeros count as idle: a minute in which any queue
      published nothing is a missing datapoint (no FILL), and missing data is not breaching, so a queue that SQS does
      not publish (inactive for six hours, and "up to 15 minutes" after it is used again) never reads as idle and the
      fleet never goes to zero while jobs wait unpublished. The workers poll every counted queue, which keeps each
      active (publishing) while they run. Any message sent in a minute restarts it, even one received and finished
      between two samples. With ``learned_keep_alive`` the sum also holds ``FILL(keepWarm, 0)``, the learned
      keep-alive's decision (``cdk.keep_alive.LearnedKeepAlive``): 1 while the arrivals' idle-time histogram, bounded
      by one cold start's price, says to keep the last task, so the fleet goes to zero at the learned keep-alive
      rather than after the fixed minutes; FILL makes a decision not published (the function failing) the fixed
      ``keep_alive_minutes`` again.

    A task stopped by the step-down gets SIGTERM and drains (the worker's ``drain_timeout_s``); ECS stops no task
    holding scale-in protection, which the worker takes only for jobs expected to outlast its drain.

    :param service: the worker service.
    :param queues: the queues whose backlog the workers serve (``CountedQueue``, or a queue counted at weight 1);
        at most 3 (CloudWatch's 10 metrics per alarm).
    :param jobs_per_task: ``J``, jobs one task is sized for: its batch plus the queue it may keep.
    :param max_tasks: most worker tasks. Default: 2.
    :param scale_out_cooldown: pause after a scale-out before the next adds more. Default: 60 s (the shortfall counts
        starting tasks, so a longer pause only delays a growing backlog).
    :param scale_in_fill: the fraction of ``J`` the remaining tasks must be able to hold before one is removed.
        Default: 0.5. At most 1, so that a count the step-down leaves never asks ``TasksShort`` for more.
    :param scale_in_minutes: consecutive minutes of spare capacity before a task is removed. Default: 3.
    :param scale_in_cooldown: pause after a step-down before the next. Default: 120 s.
    :param keep_alive_minutes: minutes with nothing visible, in flight or sent before scaling to zero. Default: 3.
    :param wake_check_interval: how often one process that queues jobs may check the service. Default: 60 s.
    :param wake_hold: how long a wake holds the service's minimum at one task (and its maximum, with
        ``wake_hold_maximum``). Default: 7 minutes: at least the keep-alive plus two minutes for the job's minute to
        reach the alarms, and about what a warm pool's replacement takes to initialize (boot, image pull, weights:
        444 s in docs/scaling.md), so that a second task asked for at the hold's end starts from the pool.
    :param learned_keep_alive: add the learned keep-alive (``cdk.keep_alive.LearnedKeepAlive``) to the keep-alive
        alarm. Default: True. Its function runs on ``code``.
    :param keep_alive_policy: its settings. Default: ``KeepAlivePolicy`` with a job-second of waiting priced at
        ``1 / jobs_per_task`` GPU-seconds (a job's share of a task), and ``keep_alive_minutes`` as the alarm's own
        minutes and as the fixed keep-alive when the histogram is not representative.
    :param code: the functions' code. Default: the ``LambdaCode`` the enclosing construct built (found in the
        scopes above); required with ``learned_keep_alive`` when there is none.
    :param wake_hold_maximum: the most tasks while a wake's hold lasts (its end puts back ``max_tasks``): for a
        service whose GPU group has a warm pool of fewer instances than ``max_tasks``, the pool's size. A task beyond
        it, asked for while the first still starts, would start on a fresh instance when the pool's replacement would
        serve it as soon, and usually after the first has cleared the burst that woke it. Default: None (the hold
        raises the minimum only).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        service: ecs.BaseService,
        queues: Sequence[sqs.IQueue | CountedQueue],
        jobs_per_task: float,
        max_tasks: int = 2,
        scale_out_cooldown: Duration = ONE_MINUTE,
        scale_in_fill: float = 0.5,
        scale_in_minutes: int = 3,
        scale_in_cooldown: Duration = Duration.minutes(2),
        keep_alive_minutes: int = 3,
        wake_check_interval: Duration = Duration.seconds(DEFAULT_WAKE_CHECK_INTERVAL_S),
        wake_hold: Duration = Duration.seconds(DEFAULT_WAKE_HOLD_S),
        wake_hold_maximum: int | None = None,
        learned_keep_alive: bool = True,
        keep_alive_policy: KeepAlivePolicy | None = None,
        code: LambdaCode | None = None,
    ) -> None:
        super().__init__(scope, id)
        counted = [q if isinstance(q, CountedQueue) else CountedQueue(q) for q in queues]
        validate(
            counted,
            jobs_per_task=jobs_per_task,
            max_tasks=max_tasks,
            scale_in_fill=scale_in_fill,
            scale_in_minutes=scale_in_minutes,
            keep_alive_minutes=keep_alive_minutes,
        )
        self.service = service
        self.queues = counted
        self.max_tasks = max_tasks
        self.wake_check_interval = wake_check_interval
        self.wake_hold = wake_hold
        self.wake_hold_maximum = wake_hold_maximum
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
                Stack.of(self).format_arn(
                    region="",
                    service="iam",
                    resource="role/aws-service-role/ecs.application-autoscaling.amazonaws.com",
                    resource_name="AWSServiceRoleForApplicationAutoScaling_ECSService",
                ),
            ),
        )

        backlog, queue_metrics = self._backlog()
        desired = cloudwatch.Metric(
            namespace="ECS/ContainerInsights",
            metric_name="DesiredTaskCount",
            dimensions_map={"ClusterName": service.cluster.cluster_name, "ServiceName": service.service_name},
            statistic="Maximum",
            period=ONE_MINUTE,
        )
        with_desired = {**queue_metrics, "desired": desired}

        needed = f"CEIL({backlog} / {jobs_per_task:g})"
        self.scale_out_alarm = self._alarm(
            "TasksShort",
            f"IF({needed} - FILL(desired, 0) >= 1, {needed}, 0)",
            with_desired,
            description=f"Fewer worker tasks wanted than the backlog needs at {jobs_per_task:g} jobs a task: set the "
            "count to what it needs",
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            threshold=1,
            minutes=1,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        scale_out = self._policy(
            "ScaleOut",
            appscaling.AdjustmentType.EXACT_CAPACITY,
            appscaling.MetricAggregationType.MAXIMUM,
            scale_out_cooldown,
        )
        # Bounds are relative to the threshold (1): a metric (the tasks needed) in [k + 1, k + 2) sets k + 1 tasks.
        for k in range(max_tasks - 1):
            scale_out.add_adjustment(adjustment=k + 1, lower_bound=k, upper_bound=k + 1)
        scale_out.add_adjustment(adjustment=max_tasks, lower_bound=max_tasks - 1)
        self.scale_out_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(scale_out))

        spare_jobs = jobs_per_task * scale_in_fill
        # MAX(x, 1) as IF: CloudWatch's MAX takes one series or an array, not a series and a number.
        self.scale_in_alarm = self._alarm(
            "TasksSpare",
            f"FILL(desired, 0) - IF({backlog} > 0, CEIL({backlog} / {spare_jobs:g}), 1)",
            with_desired,
            description=f"The backlog fits one worker task fewer at {spare_jobs:g} jobs a task: remove one",
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            threshold=1,
            minutes=scale_in_minutes,
            missing=cloudwatch.TreatMissingData.MISSING,
        )
        scale_in = self._policy(
            "ScaleIn",
            appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            appscaling.MetricAggregationType.MINIMUM,
            scale_in_cooldown,
        )
        scale_in.add_adjustment(adjustment=-1, lower_bound=0)
        self.scale_in_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(scale_in))

        sent: dict[str, cloudwatch.IMetric] = {
            f"sent{suffix}": q.queue.metric_number_of_messages_sent(statistic="Sum", period=ONE_MINUTE)
            for suffix, q in self._suffixed()
        }
        # No FILL here: a minute any queue has not published is a missing datapoint, which CloudWatch skips when the
        # evaluation range holds enough published ones (so the newest, not yet published minute does not count) and
        # reads as not breaching when it does not (an inactive queue resuming: not idle).
        activity = " + ".join(f"visible{s} + inFlight{s} + sent{s}" for s, _ in self._suffixed())
        self.keep_alive: LearnedKeepAlive | None = None
        if learned_keep_alive:
            code = code or LearnedKeepAlive.code_of(self)
            if code is None:
                raise ValueError(
                    "learned_keep_alive needs the functions' code: pass code=, or learned_keep_alive=False"
                )
            self.keep_alive = LearnedKeepAlive(
                self,
                "KeepAlive",
                service=service,
                queues=counted,
                code=code,
                policy=keep_alive_policy
                or KeepAlivePolicy(
                    wait_price=1 / jobs_per_task,
                    alarm_s=keep_alive_minutes * 60.0,
                    fallback_s=keep_alive_minutes * 60.0,
                ),
            )
            sent["keepWarm"] = self.keep_alive.keep_warm
            activity += " + FILL(keepWarm, 0)"
        self.idle_alarm = self._alarm(
            "Idle",
            activity,
            {**queue_metrics, **sent},
            description=f"No job visible, in flight or sent for {keep_alive_minutes} published minutes"
            + (" and the learned keep-alive lets the last task go" if learned_keep_alive else "")
            + ": scale workers to zero",
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_OR_EQUAL_TO_THRESHOLD,
            threshold=0,
            minutes=keep_alive_minutes,
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        to_zero = self._policy(
            "ScaleToZero", appscaling.AdjustmentType.EXACT_CAPACITY, appscaling.MetricAggregationType.MAXIMUM, None
        )
        to_zero.add_adjustment(adjustment=0, upper_bound=0)
        self.idle_alarm.add_alarm_action(cw_actions.ApplicationScalingAction(to_zero))

    # --- the wake -------------------------------------------------------------------------------------------------

    @property
    def wake_target(self) -> WakeTarget:
        """The service a submitter wakes (its fleet's route names it: ``cdk.model_fleet.ModelFleet.route``)."""
        return WakeTarget(
            cluster=self.service.cluster.cluster_name,
            service=self._service_arn_by_name,
            check_interval_s=self.wake_check_interval.to_seconds(),
            hold_s=self.wake_hold.to_seconds(),
            max_tasks=None if self.wake_hold_maximum is None else self.max_tasks,
            hold_max_tasks=self.wake_hold_maximum,
        )

    def grant_wake(self, function: lambda_.Function) -> None:
        """Let ``function`` wake the service from zero (its fleet's route names it: ``wake_target``): DescribeServices
        and UpdateService on this one service (``async_inference.wake`` makes no other ECS call), and the hold:
        RegisterScalableTarget and PutScheduledAction, on ``*`` since a template cannot name a scalable target's ARN
        (CloudFormation returns none for AWS::ApplicationAutoScaling::ScalableTarget)."""
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:DescribeServices", "ecs:UpdateService"], resources=[self._service_arn_by_name]
            )
        )
        if self.wake_hold.to_seconds() > 0:
            function.add_to_role_policy(
                iam.PolicyStatement(
                    actions=[
                        "application-autoscaling:RegisterScalableTarget",
                        "application-autoscaling:PutScheduledAction",
                    ],
                    resources=["*"],
                )
            )
            acknowledge(
                function,
                {
                    "AwsSolutions-IAM5[Resource::*]": "The wake's hold: RegisterScalableTarget and "
                    "PutScheduledAction on the worker service's scalable target, which CloudFormation "
                    "gives no ARN to name; the function only ever names that target."
                },
            )

    @property
    def _service_arn_by_name(self) -> str:
        """The service's ARN from its name (given at synth) and its cluster's, not its ``service_arn``: a function
        that referred to the service would be created only once the service is, which waits for a healthy GPU task."""
        name = self.service.node.default_child.service_name  # type: ignore[union-attr]  # the CfnService's property
        if name is None or Token.is_unresolved(name):
            raise ValueError("the worker service needs a service_name fixed at synth for the functions to wake it by")
        return Stack.of(self).format_arn(
            service="ecs", resource="service", resource_name=f"{self.service.cluster.cluster_name}/{name}"
        )

    # --- helpers --------------------------------------------------------------------------------------------------

    def _suffixed(self) -> list[tuple[str, CountedQueue]]:
        """Metric ids' suffix per queue: none for a single queue, 1, 2, ... for several."""
        if len(self.queues) == 1:
            return [("", self.queues[0])]
        return [(str(i), q) for i, q in enumerate(self.queues, start=1)]

    def _filled(self, metric_id: str) -> str:
        """A queue metric as a term of the sum. SQS stops publishing the metrics of a queue idle for hours: with
        several queues, one idle lane's missing datapoints would blank the whole sum (and with it every alarm on
        it), so each counts as 0 when missing. A single queue's missing data is the alarms' treat-missing rule."""
        return f"FILL({metric_id}, 0)" if len(self.queues) > 1 else metric_id

    def _backlog(self) -> tuple[str, dict[str, cloudwatch.IMetric]]:
        """The weighted backlog as a metric math term, and the metrics it reads."""
        metrics: dict[str, cloudwatch.IMetric] = {}
        terms = []
        for suffix, counted in self._suffixed():
            metrics[f"visible{suffix}"] = counted.queue.metric_approximate_number_of_messages_visible(
                statistic="Maximum", period=ONE_MINUTE
            )
            metrics[f"inFlight{suffix}"] = counted.queue.metric_approximate_number_of_messages_not_visible(
                statistic="Maximum", period=ONE_MINUTE
            )
            term = f"{self._filled(f'visible{suffix}')} + {self._filled(f'inFlight{suffix}')}"
            terms.append(term if counted.weight == 1 else f"{counted.weight:g} * ({term})")
        return f"({' + '.join(terms)})", metrics

    def _alarm(
        self,
        id: str,
        expression: str,
        metrics: dict[str, cloudwatch.IMetric],
        *,
        description: str,
        comparison: cloudwatch.ComparisonOperator,
        threshold: float,
        minutes: int,
        missing: cloudwatch.TreatMissingData,
    ) -> cloudwatch.Alarm:
        return cloudwatch.MathExpression(
            expression=expression, using_metrics=metrics, period=ONE_MINUTE, label=id
        ).create_alarm(
            self,
            id,
            alarm_description=description,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=minutes,
            datapoints_to_alarm=minutes,
            treat_missing_data=missing,
        )

    def _policy(
        self,
        id: str,
        adjustment: appscaling.AdjustmentType,
        aggregation: appscaling.MetricAggregationType,
        cooldown: Duration | None,
    ) -> appscaling.StepScalingAction:
        return appscaling.StepScalingAction(
            self,
            id,
            scaling_target=self.target,
            adjustment_type=adjustment,
            metric_aggregation_type=aggregation,
            cooldown=cooldown,
        )


def validate(
    queues: Sequence[CountedQueue],
    *,
    jobs_per_task: float,
    max_tasks: int,
    scale_in_fill: float,
    scale_in_minutes: int,
    keep_alive_minutes: int,
) -> None:
    """Reject options that could not scale the service (ValueError naming them)."""
    if not queues:
        raise ValueError("queues is empty: nothing would ever scale the workers out")
    if len(queues) * METRICS_PER_QUEUE + 1 > MAX_ALARM_METRICS:
        raise ValueError(
            f"queues ({len(queues)}) need {len(queues) * METRICS_PER_QUEUE + 1} metrics in the keep-alive "
            f"alarm; CloudWatch allows {MAX_ALARM_METRICS}: count at most "
            f"{(MAX_ALARM_METRICS - 1) // METRICS_PER_QUEUE} queues"
        )
    if any(q.weight <= 0 for q in queues):
        raise ValueError(f"queue weights {[q.weight for q in queues]} must be positive: a message is work")
    if jobs_per_task < 1:
        raise ValueError(f"jobs_per_task ({jobs_per_task:g}) must be at least 1")
    if max_tasks < 1:
        raise ValueError(f"max_tasks ({max_tasks}) must be at least 1")
    if not 0 < scale_in_fill <= 1:
        raise ValueError(
            f"scale_in_fill ({scale_in_fill:g}) must lie in (0, 1]: above 1 the step-down would remove "
            "a task that the scale-out (at jobs_per_task) adds back"
        )
    for name, minutes in (("scale_in_minutes", scale_in_minutes), ("keep_alive_minutes", keep_alive_minutes)):
        if minutes < 1:
            raise ValueError(f"{name} ({minutes}) must be at least 1")
