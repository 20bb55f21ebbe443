"""Webhook dispatch: per-job webhooks delivered from the result topic, signed with Standard Webhooks secrets."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
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


class WebhookDispatch(Construct):
    """A queue subscribed to the result topic (raw delivery), the dispatcher Lambda, its DLQ and the signing secret.

    Retries: after its n-th failed receive the dispatcher hides a message for ``min(WEBHOOK_BACKOFF_BASE_S * 2**(n-1),
    WEBHOOK_BACKOFF_MAX_S)`` seconds (30, 60, 120, 240, 480, 900, 900, ...). With ``WEBHOOK_MAX_RECEIVE_COUNT`` = 10
    receives the delays before the last one sum to ``settings.webhook_retry_span_s()`` = 4530 s, about 75 minutes, so
    an endpoint that is down for up to an hour still gets the webhook; after that it is in ``dead_letter_queue``.

    The function runs in no VPC: it calls tenants' endpoints on the public internet.

    :param code: the shared Lambda code.
    :param topic: the result topic to subscribe to.
    :param environment: the service's runtime configuration (``ServiceConfig.to_env()``) and Powertools settings.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        topic: sns.ITopic,
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
        self.signing_secrets = secretsmanager.Secret(
            self,
            "SigningSecrets",
            description='Standard Webhooks signing secrets per tenant: {"<tenant>": "whsec_..."}',
            secret_object_value={},
        )
        acknowledge(
            self.signing_secrets,
            {
                "AwsSolutions-SMG4": "Tenants hold these signing secrets and verify with them; rotating one is a "
                "coordinated change with the tenant, not an automatic rotation."
            },
        )
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.webhooks.handler.lambda_handler",
            description="Delivers signed job webhooks with backoff",
            service_name="async-inference-webhooks",
            environment={
                **environment,
                config.ENV_WEBHOOK_SECRET_ARN: self.signing_secrets.secret_arn,
                config.ENV_WEBHOOK_QUEUE_URL: self.queue.queue_url,
            },
            timeout=FUNCTION_TIMEOUT,
        )
        self.handler.add_event_source(
            event_sources.SqsEventSource(
                self.queue, batch_size=settings.WEBHOOK_BATCH_SIZE, report_batch_item_failures=True
            )
        )

    def grant_read_signing_secrets(self, grantee: iam.IGrantable) -> iam.Grant:
        """secretsmanager:GetSecretValue on the signing secret: what Powertools' get_secret calls (``grant_read``
        adds DescribeSecret, which nothing calls)."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["secretsmanager:GetSecretValue"], resource_arns=[self.signing_secrets.secret_arn]
        )
