"""Upload deadlines: a job whose upload never arrives ends `expired` at the end of its presign window."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration
from aws_cdk import aws_lambda_event_sources as event_sources
from constructs import Construct

from async_inference import settings
from async_inference.config import ENV_UPLOAD_DEADLINES_QUEUE_URL
from cdk.job_queue import secure_dead_letter_queue, secure_queue
from cdk.lambda_code import LambdaCode

FUNCTION_TIMEOUT = Duration.seconds(30)
# Lambda requires a visibility timeout of at least the function timeout; six times leaves room for throttled retries
# (AWS guidance). An early deadline is hidden for the rest of its grace by the handler, not by this value.
VISIBILITY_TIMEOUT = Duration.seconds(6 * 30)
# Concurrent invocations the event source may run (its ScalingConfig; 2 is the least Lambda takes): a deadline may be
# late by seconds, and the functions behind the API must keep the account's Lambda concurrency.
MAX_CONCURRENCY = 2


class UploadDeadlines(Construct):
    """The upload-deadline queue, its DLQ, and the function that expires jobs whose upload did not arrive.

    When the API creates an upload job it sends the job id here, delayed to the end of the job's presign window
    (``Job.upload_window_ends_at``; at most SQS's 900 s delay, which is ``settings.PRESIGNED_UPLOAD_EXPIRY_S``). The
    function expires the job if it is still ``awaiting_upload`` once ``settings.UPLOAD_GRACE_S`` has passed as well,
    with the reason "the upload did not arrive within its N-second presign window" and the final state's TTL; before
    that it hides the message for the rest of the grace. A deadline that keeps failing moves to ``dead_letter_queue``
    (alarmed by :class:`cdk.monitoring.Monitoring`) after ``settings.UPLOAD_DEADLINE_MAX_RECEIVE_COUNT`` receives.

    The function gets ``UPLOAD_DEADLINES_QUEUE_URL`` (to hide early messages); the API must get it too, to send.

    :param code: the shared Lambda code.
    :param environment: the service's runtime configuration and Powertools settings.
    """

    def __init__(self, scope: Construct, id: str, *, code: LambdaCode, environment: Mapping[str, str]) -> None:
        super().__init__(scope, id)
        self.dead_letter_queue = secure_dead_letter_queue(self, "DeadLetterQueue")
        self.queue = secure_queue(
            self,
            "Queue",
            dead_letter_queue=self.dead_letter_queue,
            max_receive_count=settings.UPLOAD_DEADLINE_MAX_RECEIVE_COUNT,
            visibility_timeout=VISIBILITY_TIMEOUT,
        )
        self.environment = {ENV_UPLOAD_DEADLINES_QUEUE_URL: self.queue.queue_url}
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.upload_deadlines.handler.lambda_handler",
            description="Expires upload jobs whose upload did not arrive within the presign window",
            service_name="async-inference-upload-deadlines",
            environment={**environment, **self.environment},
            timeout=FUNCTION_TIMEOUT,
        )
        # The event source grants consuming the queue, ChangeMessageVisibility (the early-deadline hide) included.
        self.handler.add_event_source(
            event_sources.SqsEventSource(
                self.queue, batch_size=10, report_batch_item_failures=True, max_concurrency=MAX_CONCURRENCY
            )
        )
