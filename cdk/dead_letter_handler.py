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
    """The Lambda that consumes the job DLQ (and the batch lane's, when given), with partial batch failures reported.

    :param code: the shared Lambda code.
    :param dead_letter_queue: the job queue's DLQ.
    :param environment: the service's runtime configuration and Powertools settings (with ``lane_dead_letter_queue``,
        the batch resources' variables too: its chunks are counted in the batch table).
    :param lane_dead_letter_queue: the batch lane's DLQ: its job claim checks fail their jobs, its chunks become
        error lines. Default: none (the function consumes the job DLQ only).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        dead_letter_queue: sqs.IQueue,
        environment: Mapping[str, str],
        lane_dead_letter_queue: sqs.IQueue | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.service_name = DEAD_LETTER_SERVICE_NAME
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.dlq.handler.lambda_handler",
            description="Fails jobs whose messages reached a DLQ, and ends dead-lettered batch chunks as error lines",
            service_name=self.service_name,
            environment=environment,
            timeout=Duration.seconds(30),
        )
        # The event source grants the function consume on the DLQ (the only permission it needs on it).
        for queue in (dead_letter_queue, lane_dead_letter_queue):
            if queue is not None:
                self.handler.add_event_source(
                    event_sources.SqsEventSource(queue, batch_size=10, report_batch_item_failures=True)
                )
