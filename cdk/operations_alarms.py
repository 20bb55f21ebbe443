"""What reaches an operator: the alarm topic (the stack's own, or one given) and the alarms and events beyond the
queues' (cdk.monitoring): GPU capacity that does not come, GPU instance launches that fail, worker tasks that stop on a
fault, Lambda errors and throttles, the API's 5xx answers. Every alarm of the stack that has no action notifies the
topic, and every function's logs go to a log group the stack owns, with retention (CDK's own handlers included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import jsii
from aws_cdk import Aspects, CfnOutput, CfnResource, Duration, IAspect, Names, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IConstruct

from cdk.nag import acknowledge

# CloudWatch metric math takes at most 10 metrics in one alarm's expression.
METRICS_PER_ALARM = 10
# How long tasks may wait for GPU instances before it is a shortfall: a cold start launches, boots and registers an
# instance in about 2 minutes (bench/scaling/figures.py INSTANCE_BOOT_S), a warm-pool start in less; 15 leaves room
# for a retry in another zone.
CAPACITY_SHORT_MINUTES = 15
# The stop codes of a task that stopped on a fault (ECS Developer Guide, "Amazon ECS stopped task error codes"); a
# scale-in or a deployment stops tasks with ServiceSchedulerInitiated, which is not one.
FAULT_STOP_CODES = ["TaskFailedToStart", "EssentialContainerExited"]
ALARM_TOPIC_OUTPUT = "AlarmTopicArn"


class OperationsAlarms(Construct):
    """The alarm topic and the alarms that reach it.

    Found in the stack when this construct is made (so it is made last; ``tests/cdk/test_operations_alarms.py``
    checks that nothing escapes): every Lambda function (Errors and Throttles, summed over at most
    ``METRICS_PER_ALARM`` functions an alarm), every REST API (5XXError), every ECS capacity provider
    (CapacityProviderReservation above 100 for ``CAPACITY_SHORT_MINUTES``: tasks wait for instances that do not
    come) and its Auto Scaling group (EventBridge: EC2 Instance Launch Unsuccessful, with EC2's reason, straight to
    the topic), every ECS cluster (EventBridge: a task stopped with one of ``FAULT_STOP_CODES``).

    :param alarm_topic: an existing topic to notify. It must let events.amazonaws.com publish (its policy) for the
        launch and task events. Default: a topic of the stack's own, named in the ``AlarmTopicArn`` output.
    :param alarm_email: an address subscribed to the topic (it confirms by email). Default: none.
    :param log_retention: retention of the log groups made for CDK's own functions.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        alarm_topic: sns.ITopic | None = None,
        alarm_email: str | None = None,
        log_retention: logs.RetentionDays,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        if alarm_topic is None:
            topic = sns.Topic(self, "AlarmTopic", display_name="async-inference alarms", enforce_ssl=True)
            acknowledge(
                topic,
                {
                    "AwsSolutions-SNS2": "Alarm and event texts only (names and counts, no request data); a KMS key "
                    "would need CloudWatch and EventBridge grants in its key policy for no data worth encrypting."
                },
            )
            CfnOutput(stack, ALARM_TOPIC_OUTPUT, value=topic.topic_arn, description="The SNS topic alarms notify")
            alarm_topic = topic
        self.topic = alarm_topic
        if alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        found = stack.node.find_all()
        self._function_alarms([c for c in found if _is_function(c)])
        for api in (c for c in found if isinstance(c, apigateway.RestApi)):
            self._alarm(
                f"Api5xx{api.node.id}",
                api.metric_server_error(period=Duration.minutes(5), statistic="Sum"),
                f"{api.rest_api_name} answered 5xx (a 5xx is a defect: bad input gets a 4xx)",
            )
        for provider in (c for c in found if isinstance(c, ecs.AsgCapacityProvider)):
            self._capacity(provider)
        for index, cluster in enumerate(c for c in found if isinstance(c, ecs.Cluster)):
            self._stopped_tasks(str(index or ""), cluster)
        Aspects.of(stack).add(_NotifyUnactioned(self.topic))
        Aspects.of(stack).add(_OwnedFunctionLogs(stack, log_retention))

    def _alarm(self, key: str, metric: cloudwatch.IMetric, description: str, *, periods: int = 1) -> cloudwatch.Alarm:
        alarm = metric.create_alarm(
            self,
            key,
            alarm_description=description,
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=periods,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.alarms[key] = alarm
        return alarm

    def _function_alarms(self, functions: Sequence[CfnResource]) -> None:
        """Errors and Throttles of every function, summed over groups of at most METRICS_PER_ALARM."""
        for start in range(0, len(functions), METRICS_PER_ALARM):
            group = functions[start : start + METRICS_PER_ALARM]
            number = start // METRICS_PER_ALARM + 1
            for metric_name in ("Errors", "Throttles"):
                metrics = {
                    f"m{index}": cloudwatch.Metric(
                        namespace="AWS/Lambda",
                        metric_name=metric_name,
                        dimensions_map={"FunctionName": function.ref},
                        statistic="Sum",
                        period=Duration.minutes(5),
                    )
                    for index, function in enumerate(group)
                }
                expression = cloudwatch.MathExpression(
                    expression=f"SUM([{','.join(metrics)}])",
                    using_metrics=metrics,
                    label=f"Lambda {metric_name}",
                    period=Duration.minutes(5),
                )
                what = "failed invocations" if metric_name == "Errors" else "throttled invocations (concurrency)"
                self._alarm(
                    f"Lambda{metric_name}{number}",
                    expression,
                    f"Lambda {what} in functions {start + 1}-{start + len(group)} of the stack: see the dashboard "
                    "and each function's log group",
                )

    def _capacity(self, provider: ecs.AsgCapacityProvider) -> None:
        """The shortfall alarm and the launch-failure events of one fleet (its GpuWorkerService holds the provider)."""
        workers = provider.node.scope
        cluster = cast(ecs.ICluster, getattr(workers, "cluster", None))
        service_name = getattr(workers, "ecs_service_name", None)
        if cluster is None or service_name is None:
            raise ValueError(f"{provider.node.path}: not beside a worker service's cluster (cdk.gpu_worker_service)")
        key = "".join(part.capitalize() for part in service_name.split("-"))
        group = provider.auto_scaling_group
        reservation = cloudwatch.Metric(
            namespace="AWS/ECS/ManagedScaling",
            metric_name="CapacityProviderReservation",
            dimensions_map={
                "CapacityProviderName": provider.capacity_provider_name,
                "ClusterName": cluster.cluster_name,
            },
            statistic="Minimum",
            period=Duration.minutes(1),
        )
        alarm = reservation.create_alarm(
            self,
            f"GpuCapacityShort{key}",
            alarm_description=(
                f"{service_name}: tasks have waited {CAPACITY_SHORT_MINUTES} minutes for GPU instances that do not "
                "come: the G/VT vCPU quota (async-inference preflight), no capacity for the instance type in the "
                "zones, or launch errors. Jobs stay queued meanwhile. See `aws autoscaling "
                "describe-scaling-activities --auto-scaling-group-name <the group>`."
            ),
            threshold=100,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=CAPACITY_SHORT_MINUTES,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.alarms[f"GpuCapacityShort{key}"] = alarm
        events.Rule(
            self,
            f"GpuLaunchFailed{key}",
            description="A GPU instance launch failed (quota, capacity, launch template): EC2's reason to the topic",
            event_pattern=events.EventPattern(
                source=["aws.autoscaling"],
                detail_type=["EC2 Instance Launch Unsuccessful"],
                detail={"AutoScalingGroupName": [group.auto_scaling_group_name]},
            ),
            targets=[
                targets.SnsTopic(
                    self.topic,
                    message=events.RuleTargetInput.from_text(
                        f"GPU instance launch failed in {events.EventField.from_path('$.detail.AutoScalingGroupName')}"
                        f": {events.EventField.from_path('$.detail.StatusMessage')}"
                    ),
                )
            ],
        )

    def _stopped_tasks(self, key: str, cluster: ecs.Cluster) -> None:
        events.Rule(
            self,
            f"WorkerTaskFailed{key}",
            description="A worker task stopped on a fault (failed to start, or its container exited)",
            event_pattern=events.EventPattern(
                source=["aws.ecs"],
                detail_type=["ECS Task State Change"],
                detail={"clusterArn": [cluster.cluster_arn], "lastStatus": ["STOPPED"], "stopCode": FAULT_STOP_CODES},
            ),
            targets=[
                targets.SnsTopic(
                    self.topic,
                    message=events.RuleTargetInput.from_text(
                        f"Worker task {events.EventField.from_path('$.detail.taskArn')} stopped "
                        f"({events.EventField.from_path('$.detail.stopCode')}): "
                        f"{events.EventField.from_path('$.detail.stoppedReason')}"
                    ),
                )
            ],
        )


def _is_function(node: IConstruct) -> bool:
    """A Lambda function's resource: ``lambda_.Function``'s CfnFunction, or the plain CfnResource of CDK's own
    singleton handlers (bucket notifications, custom resource providers)."""
    return isinstance(node, CfnResource) and node.cfn_resource_type == "AWS::Lambda::Function"


@jsii.implements(IAspect)
class _NotifyUnactioned:
    """Every alarm with no action notifies the topic (the scaling alarms keep their scaling actions only)."""

    def __init__(self, topic: sns.ITopic) -> None:
        self.topic = topic

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, cloudwatch.CfnAlarm) and not node.alarm_actions:
            node.alarm_actions = [self.topic.topic_arn]


@jsii.implements(IAspect)
class _OwnedFunctionLogs:
    """A function that logs to Lambda's default group (made by Lambda on the first invocation, kept for ever: CDK's
    own bucket-notifications handler and default-security-group provider) logs to a group of the stack's instead,
    with retention, through its LoggingConfig."""

    def __init__(self, stack: Stack, retention: logs.RetentionDays) -> None:
        self.stack = stack
        self.retention = retention

    def visit(self, node: IConstruct) -> None:
        if not _is_function(node):
            return
        if isinstance(node, lambda_.CfnFunction):
            if node.logging_config is None:
                raise ValueError(f"{node.node.path}: give the function a log group (cdk.lambda_code.LambdaCode does)")
            return
        group = logs.LogGroup(
            self.stack,
            f"{Names.unique_id(node)}Logs",
            retention=self.retention,
            removal_policy=RemovalPolicy.DESTROY,
        )
        cast(CfnResource, node).add_property_override("LoggingConfig", {"LogGroup": group.log_group_name})
