"""The DLQ handler: a job whose message exhausted its receives becomes a failed job with a reason."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_lambda_event_sources as event_sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings
from cdk.job_queue import secure_dead_letter_queue
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge

# The DLQ function's Powertools service name: the ``service`` dimension of DeadLettersUnprocessable.
DEAD_LETTER_SERVICE_NAME = "async-inference-dlq"
FUNCTION_TIMEOUT = Duration.seconds(30)
# Lambda requires a queue's visibility timeout of at least its function's timeout; AWS advises six times, so that a
# batch retried after a throttled invocation is not received again while it still runs.
VISIBILITY_TIMEOUT = Duration.seconds(6 * 30)
# Receives of one dead-lettered message before the handler gives up on it: it then moves to ``unhandled_queue``.
HANDLER_TRIES = 5
# A message keeps the receive count it reached in its source queue when SQS moves it to the DLQ (as moto keeps it;
# SQS documents no reset), so the DLQ's own redrive counts on from the source's limit: with maxReceiveCount equal to
# the source's, a dead-lettered claim check would move on to ``unhandled_queue`` at its first receive there, unhandled.
MAX_RECEIVE_COUNT = settings.MAX_RECEIVE_COUNT + HANDLER_TRIES
# Concurrent invocations the event source may run (its ScalingConfig; 2 is the least Lambda takes): a DLQ has no
# hurry, and the functions behind the API must keep the account's concurrency.
MAXIMUM_CONCURRENCY = 2


class DeadLetterHandler(Construct):
    """The Lambda that consumes the DLQs of every model's job queue and batch lane (``consume``), with partial batch
    failures reported.

    The construct decides how the queues it consumes behave as a consumer's queues: their visibility timeout is
    ``VISIBILITY_TIMEOUT`` (six times the function's), and a message the handler fails ``MAX_RECEIVE_COUNT`` times
    moves to ``unhandled_queue`` (alarmed by :class:`cdk.monitoring.Monitoring`) instead of being retried until the
    DLQ's 14-day retention ends. A DLQ made by ``cdk.job_queue.secure_dead_letter_queue`` has neither until then.

    :param code: the shared Lambda code.
    :param environment: the service's runtime configuration and Powertools settings, and the batch resources'
        variables (a lane's dead-lettered chunks are counted in the batch table).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        environment: Mapping[str, str],
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
            timeout=FUNCTION_TIMEOUT,
        )
        self.unhandled_queue = secure_dead_letter_queue(self, "Unhandled")
        acknowledge(
            self.unhandled_queue,
            {
                "AwsSolutions-SQS3": "The last queue: dead-lettered messages the DLQ handler itself could not handle, "
                "kept for an operator (alarmed)."
            },
        )

    def consume(self, queue: sqs.Queue) -> None:
        """Consume a DLQ of claim checks (a job queue's: their jobs fail) or of chunks (a batch lane's: they become
        error lines), one of a model's fleet (cdk.model_fleet). The event source grants the function consume on it
        (the only permission it needs on it)."""
        # The DLQ was built by its own construct before this consumer existed: its consumer settings are set here,
        # on the queue's CloudFormation resource.
        resource = queue.node.default_child
        assert isinstance(resource, sqs.CfnQueue)
        resource.visibility_timeout = int(VISIBILITY_TIMEOUT.to_seconds())
        resource.redrive_policy = {
            "deadLetterTargetArn": self.unhandled_queue.queue_arn,
            "maxReceiveCount": MAX_RECEIVE_COUNT,
        }
        self.handler.add_event_source(
            event_sources.SqsEventSource(
                queue, batch_size=10, report_batch_item_failures=True, max_concurrency=MAXIMUM_CONCURRENCY
            )
        )
