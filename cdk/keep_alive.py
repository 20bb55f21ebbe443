"""The learned keep-alive of a worker service: a function that reads its queues' arrivals every minute and publishes
whether the last task is to be kept (``async_inference.keep_alive``), which the keep-alive alarm adds to its idle sum."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aws_cdk import Duration, Stack, Token
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from constructs import Construct

from async_inference import settings
from async_inference.keep_alive import (
    ENV_KEEP_ALIVE_CLUSTER,
    ENV_KEEP_ALIVE_POLICY,
    ENV_KEEP_ALIVE_QUEUES,
    ENV_KEEP_ALIVE_SERVICE,
    METRIC_KEEP_WARM,
    KeepAlivePolicy,
)
from cdk.lambda_code import LambdaCode

if TYPE_CHECKING:
    from cdk.queue_scaling import CountedQueue

DECIDE_EVERY = Duration.minutes(1)


class LearnedKeepAlive(Construct):
    """Once a minute, ``lambdas.keep_alive`` reads the last ``policy.window_minutes`` of NumberOfMessagesSent of each
    counted queue (at its weight), decides with ``async_inference.keep_alive.decide`` and publishes ``KeepWarm`` (1
    keep, 0 let go), ``KeepAliveSeconds`` and ``BreakEvenSeconds`` under ``settings.METRICS_NAMESPACE`` with the
    service's name as dimension. ``keep_warm`` is the metric the keep-alive alarm reads.

    :param service: the worker service whose last task the decision keeps.
    :param queues: the counted queues whose arrivals are the histogram.
    :param code: the functions' code and layer.
    :param policy: the keep-alive's settings (``KeepAlivePolicy``, each documented with its default).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        service: ecs.BaseService,
        queues: Sequence[CountedQueue],
        code: LambdaCode,
        policy: KeepAlivePolicy,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.policy = policy
        # The service's name as given at synth where it is (the stack's services): a reference to the service would
        # hold the function back until the service is created, which waits for a healthy GPU task.
        fixed = getattr(service.node.default_child, "service_name", None)
        service_name = fixed if isinstance(fixed, str) and not Token.is_unresolved(fixed) else service.service_name
        self.function = code.new_function(
            self,
            "Decide",
            handler="lambdas.keep_alive.handler.lambda_handler",
            description="Decides from the queues' arrivals whether the last GPU worker task is kept warm",
            service_name="async-inference-keep-alive",
            environment={
                ENV_KEEP_ALIVE_POLICY: policy.to_json(),
                ENV_KEEP_ALIVE_QUEUES: stack.to_json_string([[q.queue.queue_name, q.weight] for q in queues]),
                ENV_KEEP_ALIVE_SERVICE: service_name,
                ENV_KEEP_ALIVE_CLUSTER: service.cluster.cluster_name,
                "POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE,
            },
            timeout=Duration.seconds(30),
        )
        # GetMetricData and PutMetricData support no resource-level permission (the function's X-Ray statement
        # already acknowledges Resource::* on this role, cdk.lambda_code); PutMetricData is held to the namespace.
        self.function.add_to_role_policy(iam.PolicyStatement(actions=["cloudwatch:GetMetricData"], resources=["*"]))
        self.function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": settings.METRICS_NAMESPACE}},
            )
        )
        events.Rule(
            self,
            "EveryMinute",
            description="Runs the keep-alive decision of the GPU workers every minute",
            schedule=events.Schedule.rate(DECIDE_EVERY),
            targets=[targets.LambdaFunction(self.function)],
        )
        self.keep_warm = cloudwatch.Metric(
            namespace=settings.METRICS_NAMESPACE,
            metric_name=METRIC_KEEP_WARM,
            dimensions_map={"ServiceName": service.service_name},
            statistic="Maximum",
            period=DECIDE_EVERY,
        )

    @staticmethod
    def code_of(scope: Construct) -> LambdaCode | None:
        """The functions' code the enclosing service built (a ``LambdaCode`` beside ``scope`` or one of its
        ancestors), or None."""
        for ancestor in reversed(scope.node.scopes):
            found = next((c for c in ancestor.node.children if isinstance(c, LambdaCode)), None)
            if found is not None:
                return found
        return None
