"""The inbox: objects written under the inbox rules' prefixes become jobs and batches (async_inference.inbox)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from aws_cdk import Duration
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from constructs import Construct

from async_inference.config import ENV_INBOX_RULES
from async_inference.inbox import FUNCTION_TIMEOUT_S, InboxRule
from cdk.job_queue import secure_dead_letter_queue
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge
from cdk.upload_intake import ASYNC_RETRY_ATTEMPTS, MAX_EVENT_AGE

FUNCTION_TIMEOUT = Duration.seconds(FUNCTION_TIMEOUT_S)  # the claims of batches being created outlive it


class Inbox(Construct):
    """The inbox function and one S3 ObjectCreated notification per rule, filtered on the rule's prefix under
    ``settings.INBOX_PREFIX``, as uploads are taken in (cdk.upload_intake.UploadIntake): S3 invokes the function
    asynchronously, Lambda retries a failed event twice, then keeps it in ``failure_queue`` (alarmed).

    The platform's pipelines need ``s3:PutObject`` on ``<bucket ARN>/inbox/<prefix>*`` (the stack output
    ``BucketName``); the stack grants none, since it does not know their roles.

    :param code: the shared Lambda code.
    :param bucket: the claim-check bucket.
    :param rules: the inbox rules (at least one); S3 refuses two notifications whose prefixes overlap.
    :param environment: the service's runtime configuration and Powertools settings, the batch resources' included.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        bucket: s3.Bucket,
        rules: Sequence[InboxRule],
        environment: Mapping[str, str],
    ) -> None:
        super().__init__(scope, id)
        self.rules = list(rules)
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.inbox.handler.lambda_handler",
            description="Turns objects written under the inbox rules' prefixes into jobs and batches",
            service_name="async-inference-inbox",
            environment={
                **environment,
                ENV_INBOX_RULES: json.dumps([rule.model_dump(exclude_none=True) for rule in self.rules]),
            },
            timeout=FUNCTION_TIMEOUT,
        )
        self.failure_queue = secure_dead_letter_queue(self, "FailureQueue")
        acknowledge(
            self.failure_queue,
            {
                "AwsSolutions-SQS3": "This queue is itself a dead-letter destination: the inbox function's "
                "on-failure destination for S3 events that exhausted their retries."
            },
        )
        self.handler.configure_async_invoke(
            on_failure=destinations.SqsDestination(self.failure_queue),
            retry_attempts=ASYNC_RETRY_ATTEMPTS,
            max_event_age=MAX_EVENT_AGE,
        )
        for rule in self.rules:
            bucket.add_event_notification(
                s3.EventType.OBJECT_CREATED,
                s3n.LambdaDestination(self.handler),
                s3.NotificationKeyFilter(prefix=rule.key_prefix),
            )


def validate_rules(rules: Sequence[InboxRule], tenants: Sequence[str], models: Sequence[str]) -> None:
    """Reject rules the stack cannot deploy or run (ValueError naming the rule and the fix)."""
    prefixes = [rule.key_prefix for rule in rules]
    for rule in rules:
        if rule.tenant not in tenants:
            raise ValueError(f"inbox_rules: {rule.prefix}: tenant {rule.tenant!r} is not one of the tenants {tenants}")
        if rule.model not in models:
            raise ValueError(f"inbox_rules: {rule.prefix}: model {rule.model!r} is not one of the models {models}")
        nested = [other for other in prefixes if other != rule.key_prefix and other.startswith(rule.key_prefix)]
        if nested or prefixes.count(rule.key_prefix) > 1:
            raise ValueError(
                f"inbox_rules: the prefix {rule.prefix!r} overlaps {nested or [rule.prefix]}: S3 refuses notifications "
                "whose prefixes overlap; give each rule a prefix of its own"
            )
