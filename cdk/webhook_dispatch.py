"""Webhook dispatch: per-job webhooks delivered from the result topic, signed with Standard Webhooks secrets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings
from cdk.job_queue import secure_dead_letter_queue, secure_queue
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge
from cdk.tenant_stacks import TenantStacks

# The dispatcher delivers a batch at once, each delivery with its own timeout: settings explains the figure.
FUNCTION_TIMEOUT = Duration.seconds(settings.WEBHOOK_DISPATCHER_TIMEOUT_S)
# Letters and digits only: 48 of them are the base64 of 36 random bytes (about 286 bits of entropy), a Standard Webhooks
# secret once "whsec_" is put in front (async_inference.webhooks.secrets), within the 24 to 64 bytes the spec advises.
SIGNING_SECRET_CHARS = 48
# Concurrent invocations each tenant's event source may run (its ScalingConfig; 2 is the least Lambda takes): each
# delivers a batch of WEBHOOK_BATCH_SIZE at once, so a tenant keeps 20 deliveries in flight, and the tenants together
# 2 invocations each of the account's Lambda concurrency (new accounts get little; the functions behind the API need
# theirs).
MAX_CONCURRENCY = 2
# What SqsEventSource grants a function on its queue (grantConsumeMessages), and what the dispatcher's backoff calls.
_CONSUME_ACTIONS = [
    "sqs:ReceiveMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueUrl",
    "sqs:DeleteMessage",
    "sqs:GetQueueAttributes",
]


class WebhookDispatch(Construct):
    """One queue per tenant subscribed to the result topic (raw delivery, the tenant's events only), the dispatcher
    Lambda with one event source per queue, their DLQ, and one signing secret per tenant.

    A queue per tenant: an invocation ends with its slowest delivery, so on one shared queue a tenant whose receivers
    hold each attempt to its deadline held the batches behind it, any tenant's, a deadline each (its pause,
    ``async_inference.webhooks.slow_receivers``, cut that to one deadline a minute, not to none). Each tenant's events
    now wait only behind its own, in its own queue, read by its own event source with its own concurrency.

    Signing secrets: each tenant gets a Secrets Manager secret whose value Secrets Manager generates at deploy
    (``SIGNING_SECRET_CHARS`` letters and digits: ``async_inference.webhooks.secrets`` reads it as a ``whsec_``
    secret), so the first deploy ends with every tenant's webhooks signed, and nobody has to write a value. The
    dispatcher reads ``WEBHOOK_SECRET_ARNS`` (tenant -> ARN) from the deployment's catalog (``cdk.catalog``, each
    tenant's entry) and may read exactly these secrets (with ``tenant_stacks``, those named under the stack's
    prefix: ``cdk.tenant_stacks``); the stack output
    ``WebhookSigningSecretArns`` gives the same map to the operator's ``python -m async_inference.cli
    webhook-secret``. A tenant added to the context gets its secret on the next deploy; rotating one is
    docs/deploying.md's.

    Retries: after its n-th failed receive the dispatcher hides a message for ``min(WEBHOOK_BACKOFF_BASE_S * 2**(n-1),
    WEBHOOK_BACKOFF_MAX_S)`` seconds (30, 60, 120, 240, 480, 900, 900, ...). With ``WEBHOOK_MAX_RECEIVE_COUNT`` = 10
    receives the delays before the last one sum to ``settings.webhook_retry_span_s()`` = 4530 s, about 75 minutes, so
    an endpoint that is down for up to an hour still gets the webhook; after that it is in ``dead_letter_queue``.

    The function runs in no VPC: it calls tenants' endpoints on the public internet.

    :param code: the shared Lambda code.
    :param topic: the result topic to subscribe to.
    :param tenants: the tenant ids, one signing secret each.
    :param environment: the service's runtime configuration (``ServiceConfig.to_env()``) and Powertools settings.
    :param tenant_stacks: the nested stacks that hold the tenants' queues, event sources and secrets
        (``cdk.tenant_stacks``). Default: None (this construct holds them).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        topic: sns.ITopic,
        tenants: Sequence[str],
        environment: Mapping[str, str],
        tenant_stacks: TenantStacks | None = None,
    ) -> None:
        super().__init__(scope, id)
        self._tenant_stacks = tenant_stacks
        self.dead_letter_queue = secure_dead_letter_queue(self, "DeadLetterQueue")
        if tenant_stacks is not None:
            acknowledge(
                self.dead_letter_queue,
                {
                    "AwsSolutions-SQS3": "The tenants' webhook queues' DLQ: cdk-nag reads each template alone, and "
                    "the queues that name it are in the nested stacks (cdk.tenant_stacks)."
                },
            )
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.webhooks.handler.lambda_handler",
            description="Delivers signed job webhooks with backoff",
            service_name="async-inference-webhooks",
            environment=dict(environment),
            timeout=FUNCTION_TIMEOUT,
        )
        self.queues: dict[str, sqs.Queue] = {}  # by tenant
        self.signing_secrets: dict[str, secretsmanager.Secret] = {}
        for tenant in sorted(tenants):
            self._add_tenant(tenant, topic)
        self.secret_arns_json = Stack.of(self).to_json_string(
            {tenant: secret.secret_arn for tenant, secret in self.signing_secrets.items()}
        )
        self.queue_urls_json = Stack.of(self).to_json_string(
            {
                tenant: tenant_stacks.queue_url(tenant) if tenant_stacks else queue.queue_url
                for tenant, queue in self.queues.items()
            }
        )
        if tenant_stacks is not None:
            # By the queues' name prefix: one statement for every tenant (cdk.tenant_stacks). Lambda checks the
            # role when it creates an event source, so the nested stacks wait for the policy.
            self.handler.add_to_role_policy(
                iam.PolicyStatement(actions=_CONSUME_ACTIONS, resources=[tenant_stacks.queue_arns()])
            )
            for stack in tenant_stacks.stacks.values():
                assert self.handler.role is not None  # new_function makes one
                stack.node.add_dependency(self.handler.role)
            acknowledge(
                self.handler,
                {
                    tenant_stacks.queues_finding(): "Every tenant's webhook queue, named under this "
                    "stack's prefix (cdk.tenant_stacks): the dispatcher consumes each of them.",
                },
            )

    def _add_tenant(self, tenant: str, topic: sns.ITopic) -> None:
        """``tenant``'s queue (subscribed to its events of ``topic``), its event source and its signing secret: here,
        where they were always deployed, or in its nested stack under names of the stack's prefix."""
        nested = self._tenant_stacks
        scope = nested.scope(tenant, "Webhooks") if nested else self
        queue = secure_queue(
            scope,
            f"Queue-{tenant}",
            dead_letter_queue=self.dead_letter_queue,
            max_receive_count=settings.WEBHOOK_MAX_RECEIVE_COUNT,
            # Lambda requires at least the function timeout; 6x leaves room for throttled invocations (AWS
            # guidance). A failed delivery gets its backoff from the dispatcher (ChangeMessageVisibility).
            visibility_timeout=Duration.seconds(settings.WEBHOOK_QUEUE_VISIBILITY_TIMEOUT_S),
            **({"queue_name": nested.queue_name(tenant)} if nested else {}),
        )
        # Only the tenant's notifications of jobs that have a webhook (both attributes set by the publisher).
        tenants_with_webhook = {
            name: sns.SubscriptionFilter.string_filter(allowlist=values)
            for name, values in settings.webhook_filter_policy(tenant).items()
        }
        # A nested stack subscribes its queues to the topic by ARN: with the Topic itself, the CDK would make the
        # nested stack depend on its own parent.
        subscribed = topic
        if nested:
            found = scope.node.try_find_child("ResultTopic")
            subscribed = found or sns.Topic.from_topic_arn(scope, "ResultTopic", topic.topic_arn)  # type: ignore[assignment]
        subscribed.add_subscription(
            subscriptions.SqsSubscription(queue, raw_message_delivery=True, filter_policy=tenants_with_webhook)
        )
        self.queues[tenant] = queue
        secret = secretsmanager.Secret(
            scope,
            f"SigningSecret-{tenant}",
            description=f"Standard Webhooks signing secret of tenant {tenant} (whsec_ + this value)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=SIGNING_SECRET_CHARS, exclude_punctuation=True, include_space=False
            ),
            **({"secret_name": nested.secret_name(tenant)} if nested else {}),
        )
        acknowledge(
            secret,
            {
                "AwsSolutions-SMG4": "The tenant holds this signing secret and verifies with it; rotating it is a "
                "coordinated change with the tenant (docs/deploying.md), not an automatic rotation."
            },
        )
        self.signing_secrets[tenant] = secret
        if nested is None:
            self.handler.add_event_source(
                event_sources.SqsEventSource(
                    queue,
                    batch_size=settings.WEBHOOK_BATCH_SIZE,
                    report_batch_item_failures=True,
                    max_concurrency=MAX_CONCURRENCY,
                )
            )
            return
        # In the tenant's stack, beside its queue (an event source made by the function would be the root's), with
        # the rights it needs granted by the queue prefix (above).
        lambda_.EventSourceMapping(
            scope,
            f"Events-{tenant}",
            target=self.handler,
            event_source_arn=queue.queue_arn,
            batch_size=settings.WEBHOOK_BATCH_SIZE,
            report_batch_item_failures=True,
            max_concurrency=MAX_CONCURRENCY,
        )

    def grant_send(self, grantee: iam.IGrantable) -> None:
        """sqs:SendMessage on every tenant's queue: the worker's "started" events."""
        if self._tenant_stacks is not None:
            queues = self._tenant_stacks.queue_arns()
            iam.Grant.add_to_principal(grantee=grantee, actions=["sqs:SendMessage"], resource_arns=[queues])
            reason = "Every tenant's webhook queue, named under this stack's prefix (cdk.tenant_stacks)."
            acknowledge(grantee, {self._tenant_stacks.queues_finding(): reason})  # type: ignore[arg-type]
            return
        for queue in self.queues.values():
            queue.grant(grantee, "sqs:SendMessage")

    def grant_read_signing_secrets(self, grantee: iam.IGrantable) -> iam.Grant:
        """secretsmanager:GetSecretValue on the tenants' signing secrets: what Powertools' get_secret calls
        (``grant_read`` adds DescribeSecret, which nothing calls)."""
        if self._tenant_stacks is not None:
            secrets = self._tenant_stacks.secret_arns()
            reason = "Every tenant's signing secret, named under this stack's prefix (cdk.tenant_stacks)."
            acknowledge(grantee, {self._tenant_stacks.secrets_finding(): reason})  # type: ignore[arg-type]
            resources = [secrets]
        else:
            resources = [secret.secret_arn for secret in self.signing_secrets.values()]
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["secretsmanager:GetSecretValue"], resource_arns=resources
        )
