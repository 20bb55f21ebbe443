"""EventBridge events for each job and batch state change (async_inference.state_events)."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from async_inference import settings
from async_inference.config import ENV_EVENT_BUS_NAME
from cdk.lambda_code import LambdaCode

DEFAULT_BUS = "default"


class StateEvents(Construct):
    """The state-events function, subscribed to the result topic (a job's final state, a batch's end) and, when the
    stack has one, the job event topic (a job's start), putting each on the account's default event bus: rules there
    route them to any target (``source: async-inference``, a ``detail-type`` per state).

    The default bus rather than a bus of the stack's: consumers write their rules where AWS services' own events are,
    and nothing is deleted with the stack. The function may PutEvents on that bus only.

    :param code: the shared Lambda code.
    :param result_topic: the result topic.
    :param events_topic: the job event topic (job.started), or None.
    :param environment: Powertools settings.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        result_topic: sns.ITopic,
        events_topic: sns.ITopic | None,
        environment: Mapping[str, str],
    ) -> None:
        super().__init__(scope, id)
        self.bus_name = DEFAULT_BUS
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.state_events.handler.lambda_handler",
            description="Puts each job and batch state change on the default EventBridge bus",
            service_name="async-inference-state-events",
            environment={**environment, ENV_EVENT_BUS_NAME: self.bus_name},
            timeout=Duration.seconds(30),
        )
        final = [settings.RESULT_EVENT, *settings.BATCH_RESULT_EVENTS]
        result_topic.add_subscription(
            subscriptions.LambdaSubscription(
                self.handler,
                filter_policy={settings.EVENT_ATTRIBUTE: sns.SubscriptionFilter.string_filter(allowlist=final)},
            )
        )
        if events_topic is not None:
            events_topic.add_subscription(
                subscriptions.LambdaSubscription(
                    self.handler,
                    filter_policy={
                        settings.EVENT_ATTRIBUTE: sns.SubscriptionFilter.string_filter(allowlist=["job.started"])
                    },
                )
            )
        self.bus_arn = Stack.of(self).format_arn(service="events", resource="event-bus", resource_name=self.bus_name)
        self.handler.add_to_role_policy(iam.PolicyStatement(actions=["events:PutEvents"], resources=[self.bus_arn]))
