"""Webhook dispatch: per-job webhooks delivered from the result topic, signed with Standard Webhooks secrets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aws_cdk import Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from async_inference import config, settings
from cdk.job_queue import secure_dead_letter_queue, secure_queue
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge

# The dispatcher delivers a batch at once, each delivery with its own timeout: settings explains the figure.
FUNCTION_TIMEOUT = Duration.seconds(settings.WEBHOOK_DISPATCHER_TIMEOUT_S)
# Letters and digits only: 48 of them are the base64 of 36 random bytes (about 286 bits of entropy), a Standard Webhooks
# secret once "whsec_" is put in front (async_inference.webhooks.secrets), within the 24 to 64 bytes the spec advises.
SIGNING_SECRET_CHARS = 48
# Concurrent invocations the event source may run (its ScalingConfig): each delivers a batch of WEBHOOK_BATCH_SIZE at
# once, so 3 keep 30 deliveries in flight, and leave the account's Lambda concurrency (new accounts get little) to the
# functions behind the API.
MAX_CONCURRENCY = 3


class WebhookDispatch(Construct):
    """A queue subscribed to the result topic (raw delivery), the dispatcher Lambda, its DLQ, and one signing secret
    per tenant.

    Signing secrets: each tenant gets a Secrets Manager secret whose value Secrets Manager generates at deploy
    (``SIGNING_SECRET_CHARS`` letters and digits: ``async_inference.webhooks.secrets`` reads it as a ``whsec_``
    secret), so the first deploy ends with every tenant's webhooks signed, and nobody has to write a value. The
    dispatcher reads ``WEBHOOK_SECRET_ARNS`` (tenant -> ARN) from the deployment's catalog (``cdk.catalog``, each
    tenant's entry) and may read exactly these secrets; the stack output
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
    ) -> None:
        super().__init__(scope, id)
        self.dead_letter_queue = secure_dead_letter_queue(self, "DeadLetterQueue")
        self.queue = secure_queue(
            self,
            "Queue",
            dead_letter_queue=self.dead_letter_queue,
            max_receive_count=settings.WEBHOOK_MAX_RECEIVE_COUNT,
            # Lambda requires at least the function timeout; 6x leaves room for throttled invocations (AWS guidance).
            # A failed delivery gets its backoff from the dispatcher (ChangeMessageVisibility), not from this value.
            visibility_timeout=Duration.seconds(settings.WEBHOOK_QUEUE_VISIBILITY_TIMEOUT_S),
        )
        # Only notifications of jobs that have a webhook reach the dispatcher (the attribute is set by the publisher).
        webhook_only = {
            name: sns.SubscriptionFilter.string_filter(allowlist=values)
            for name, values in settings.WEBHOOK_FILTER_POLICY.items()
        }
        topic.add_subscription(
            subscriptions.SqsSubscription(self.queue, raw_message_delivery=True, filter_policy=webhook_only)
        )
        self.signing_secrets: dict[str, secretsmanager.Secret] = {}
        for tenant in sorted(tenants):
            secret = secretsmanager.Secret(
                self,
                f"SigningSecret-{tenant}",
                description=f"Standard Webhooks signing secret of tenant {tenant} (whsec_ + this value)",
                generate_secret_string=secretsmanager.SecretStringGenerator(
                    password_length=SIGNING_SECRET_CHARS, exclude_punctuation=True, include_space=False
                ),
            )
            acknowledge(
                secret,
                {
                    "AwsSolutions-SMG4": "The tenant holds this signing secret and verifies with it; rotating it is a "
                    "coordinated change with the tenant (docs/deploying.md), not an automatic rotation."
                },
            )
            self.signing_secrets[tenant] = secret
        self.secret_arns_json = Stack.of(self).to_json_string(
            {tenant: secret.secret_arn for tenant, secret in self.signing_secrets.items()}
        )
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.webhooks.handler.lambda_handler",
            description="Delivers signed job webhooks with backoff",
            service_name="async-inference-webhooks",
            environment={
                **environment,
                config.ENV_WEBHOOK_QUEUE_URL: self.queue.queue_url,
            },
            timeout=FUNCTION_TIMEOUT,
        )
        self.handler.add_event_source(
            event_sources.SqsEventSource(
                self.queue,
                batch_size=settings.WEBHOOK_BATCH_SIZE,
                report_batch_item_failures=True,
                max_concurrency=MAX_CONCURRENCY,
            )
        )

    def grant_read_signing_secrets(self, grantee: iam.IGrantable) -> iam.Grant:
        """secretsmanager:GetSecretValue on the tenants' signing secrets: what Powertools' get_secret calls
        (``grant_read`` adds DescribeSecret, which nothing calls)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["secretsmanager:GetSecretValue"],
            resource_arns=[secret.secret_arn for secret in self.signing_secrets.values()],
        )
