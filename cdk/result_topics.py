"""The result topic: one notification per finished job, fanned out to the subscriptions a platform team configures."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from aws_cdk import Duration
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings
from async_inference.jobs import JobStatus
from cdk.nag import acknowledge

Protocol = Literal["email", "https", "sqs"]
PROTOCOLS: tuple[Protocol, ...] = ("email", "https", "sqs")


@dataclass(frozen=True, kw_only=True)
class TopicSubscription:
    """One subscriber of the result topic.

    A notification carries the job's result inline (up to 128 KB) and every notification is published with a
    ``tenant`` message attribute: a subscription with no ``tenants`` receives every tenant's results. Give a tenant
    its results with ``tenant_scoped=True``, which refuses to be created unless it names exactly that tenant.

    :param protocol: ``email``, ``https`` or ``sqs``.
    :param endpoint: the address, the URL (https only) or the queue ARN.
    :param statuses: job statuses delivered (a filter policy on the ``status`` message attribute). Default: all.
    :param tenants: tenants whose notifications are delivered (a filter policy on the ``tenant`` message attribute).
        Default: every tenant's (an operator's subscription).
    :param tenant_scoped: the subscription belongs to a tenant: ``tenants`` must name exactly one. Default: False.
    :param raw_message_delivery: deliver the bare notification JSON (https and sqs only). Default: False.
    """

    protocol: Protocol
    endpoint: str
    statuses: Sequence[str] | None = None
    tenants: Sequence[str] | None = None
    tenant_scoped: bool = False
    raw_message_delivery: bool = False

    def __post_init__(self) -> None:
        if self.tenants is not None and (isinstance(self.tenants, str) or not self.tenants):
            raise ValueError(f"subscription {self.endpoint!r}: tenants must be a non-empty list of tenant ids")
        if self.tenant_scoped and (self.tenants is None or len(self.tenants) != 1):
            raise ValueError(
                f"subscription {self.endpoint!r} is tenant_scoped, so it must name exactly one tenant in tenants "
                f"(got {list(self.tenants) if self.tenants else 'none'}): unfiltered, it would receive every "
                "tenant's results"
            )
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"subscription protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if self.protocol == "https" and not self.endpoint.startswith("https://"):
            raise ValueError(f"https subscription endpoint {self.endpoint!r} must start with https://")
        if self.protocol == "sqs" and not self.endpoint.startswith("arn:aws"):
            raise ValueError(f"sqs subscription endpoint {self.endpoint!r} must be a queue ARN")
        if self.protocol == "email" and self.raw_message_delivery:
            raise ValueError(f"raw_message_delivery conflicts with protocol 'email' (endpoint {self.endpoint!r})")
        known = {s.value for s in JobStatus}
        unknown = sorted(set(self.statuses or ()) - known)
        if unknown or (self.statuses is not None and not self.statuses):
            raise ValueError(f"subscription {self.endpoint!r}: statuses {unknown or '[]'} not among {sorted(known)}")


class ResultTopics(Construct):
    """An encrypted, TLS-only SNS topic for job results, its subscriptions, and a DLQ for HTTPS deliveries.

    Publishers set the message attributes ``status``, ``tenant`` and ``model``; subscriptions filter on ``status`` and
    ``tenant``.
    HTTPS deliveries that exhaust SNS's retry policy land in ``subscription_dead_letter_queue`` instead of vanishing.
    SQS subscriptions to queues this stack does not own need the queue owner to allow ``sns.amazonaws.com`` to send.

    :param subscriptions: subscribers. Default: none.
    :param tenants: the stack's tenant ids: a subscription naming another is refused. Default: not checked.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        subscriptions: Sequence[TopicSubscription] = (),
        tenants: Collection[str] | None = None,
    ) -> None:
        super().__init__(scope, id)
        for spec in subscriptions:
            unknown = sorted(set(spec.tenants or ()) - set(tenants)) if tenants is not None else []
            if unknown:
                raise ValueError(
                    f"subscription {spec.endpoint!r}: tenants {unknown} are not among the stack's "
                    f"tenants {sorted(tenants or ())}"
                )
        # A key of our own (not alias/aws/sns): grant_publish can then name this one key in each publisher's policy.
        self.key = kms.Key(self, "TopicKey", description="Encrypts job result notifications", enable_key_rotation=True)
        self.topic = sns.Topic(
            self, "ResultTopic", display_name="Inference job results", master_key=self.key, enforce_ssl=True
        )
        self.subscription_dead_letter_queue = sqs.Queue(
            self,
            "SubscriptionDeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(settings.DLQ_RETENTION_DAYS),
        )
        acknowledge(
            self.subscription_dead_letter_queue,
            {"AwsSolutions-SQS3": "This queue is itself a DLQ: SNS's redrive target for failed HTTPS deliveries."},
        )
        for index, subscription in enumerate(subscriptions):
            self.topic.add_subscription(self._subscription(index, subscription))

    def grant_publish(self, grantee: iam.IGrantable) -> None:
        """sns:Publish on the topic (PublishBatch is authorized as Publish), and on its key the two calls SNS makes
        for an encrypted publish: GenerateDataKey and Decrypt (``topic.grant_publish`` writes GenerateDataKey*)."""
        iam.Grant.add_to_principal(grantee=grantee, actions=["sns:Publish"], resource_arns=[self.topic.topic_arn])
        self.key.grant(grantee, "kms:GenerateDataKey", "kms:Decrypt")

    def _subscription(self, index: int, spec: TopicSubscription) -> sns.ITopicSubscription:
        filters = {}
        if spec.statuses:
            filters["status"] = sns.SubscriptionFilter.string_filter(allowlist=list(spec.statuses))
        if spec.tenants:
            filters["tenant"] = sns.SubscriptionFilter.string_filter(allowlist=list(spec.tenants))
        filter_policy = filters or None
        if spec.protocol == "email":
            return subscriptions.EmailSubscription(spec.endpoint, filter_policy=filter_policy)
        if spec.protocol == "https":
            return subscriptions.UrlSubscription(
                spec.endpoint,
                protocol=sns.SubscriptionProtocol.HTTPS,
                raw_message_delivery=spec.raw_message_delivery,
                filter_policy=filter_policy,
                dead_letter_queue=self.subscription_dead_letter_queue,
            )
        queue = sqs.Queue.from_queue_arn(self, f"Subscriber{index}", spec.endpoint)
        return subscriptions.SqsSubscription(
            queue, raw_message_delivery=spec.raw_message_delivery, filter_policy=filter_policy
        )
