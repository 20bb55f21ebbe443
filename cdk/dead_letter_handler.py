"""The DLQ handler: a job whose message exhausted its receives becomes a failed job with a reason."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from cdk.lambda_code import LambdaCode

# The DLQ function's Powertools service name: the ``service`` dimension of DeadLettersUnprocessable.
DEAD_LETTER_SERVICE_NAME = "async-inference-dlq"

class DeadLetterHandler(Construct):
    """The Lambda that consumes the job DLQ, with partial batch failures reported.

    :param code: the shared Lambda code.
    :param dead_letter_queue: the job queue's DLQ.
    :param environment: the service's runtime configuration and Powertools settings.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        dead_letter_queue: sqs.IQueue,
        environment: Mapping[str, str],
    ) -> None:
        super().__init__(scope, id)
        self.service_name = DEAD_LETTER_SERVICE_NAME
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.dlq.handler.lambda_handler",
            description="Marks jobs whose messages reached the DLQ as failed and notifies",
            service_name=self.service_name,
            environment=environment,
            timeout=Duration.seconds(30),
        )
        # The event source grants the function consume on the DLQ (the only permission it needs on it).
        self.handler.add_event_source(
            event_sources.SqsEventSource(dead_letter_queue, batch_size=10, report_batch_item_failures=True)
        )
