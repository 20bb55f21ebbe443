"""Upload intake: a presigned upload landing in the bucket queues its job; an event that keeps failing is kept."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from constructs import Construct

from async_inference import settings
from cdk.job_queue import secure_dead_letter_queue
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge

NOTIFICATIONS_HANDLER_ID = "BucketNotificationsHandler050a0587b7544547bf325f094a3db834"
# S3 invokes the function asynchronously: Lambda retries a failed event twice (1 and 2 minutes later), then hands it to
# the failure queue. An event older than an hour is not worth running: by then the upload-deadline handler has
# expired a job whose upload was never accepted, so the event would find it final.
ASYNC_RETRY_ATTEMPTS = 2
MAX_EVENT_AGE = Duration.hours(1)


class UploadIntake(Construct):
    """The upload Lambda and the S3 ObjectCreated notifications that trigger it: on ``settings.UPLOAD_PREFIX`` (upload
    jobs), and on Files API uploads (``settings.file_upload_key``).

    Inline bodies are written under ``settings.REQUEST_PREFIX`` by the API, so they never trigger this function.

    An event whose invocations all fail (``ASYNC_RETRY_ATTEMPTS`` retries) is not dropped: it lands in
    ``failure_queue`` (encrypted, TLS only; alarmed by :class:`cdk.monitoring.Monitoring`), each record holding the
    S3 event as ``requestPayload``, so an operator can see which upload was not taken in and invoke the function with
    it again. Its job meanwhile ends ``expired`` at the end of its upload window (the upload-deadline handler).

    :param code: the shared Lambda code.
    :param bucket: the claim-check bucket.
    :param environment: the service's runtime configuration and Powertools settings.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        bucket: s3.Bucket,
        environment: Mapping[str, str],
    ) -> None:
        super().__init__(scope, id)
        self.handler = code.new_function(
            self,
            "Handler",
            handler="lambdas.upload.handler.lambda_handler",
            description="Validates presigned uploads and queues their jobs",
            service_name="async-inference-upload",
            environment=environment,
            timeout=Duration.seconds(settings.UPLOAD_INTAKE_TIMEOUT_S),
        )
        self.failure_queue = secure_dead_letter_queue(self, "FailureQueue")
        acknowledge(
            self.failure_queue,
            {
                "AwsSolutions-SQS3": "This queue is itself a dead-letter destination: the upload function's on-failure "
                "destination for S3 events that exhausted their retries."
            },
        )
        self.handler.configure_async_invoke(
            on_failure=destinations.SqsDestination(self.failure_queue),
            retry_attempts=ASYNC_RETRY_ATTEMPTS,
            max_event_age=MAX_EVENT_AGE,
        )
        bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.LambdaDestination(self.handler),
            s3.NotificationKeyFilter(prefix=settings.UPLOAD_PREFIX),
        )
        # Files API uploads (their own last key part): bytes whose file was deleted before they arrived are deleted.
        bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.LambdaDestination(self.handler),
            s3.NotificationKeyFilter(prefix=settings.FILE_PREFIX, suffix="/" + settings.FILE_UPLOAD_NAME),
        )
        # CDK configures bucket notifications through one custom-resource Lambda per stack, created on first use.
        notifications_handler = Stack.of(self).node.find_child(NOTIFICATIONS_HANDLER_ID)
        acknowledge(
            notifications_handler,
            {
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AWSLambdaBasicExecutionRole]": "CDK's bucket-notification custom resource: logging policy only.",
                "AwsSolutions-IAM5[Resource::*]": "CDK's bucket-notification custom resource calls "
                "s3:PutBucketNotification at deploy time; its policy is written by aws-cdk-lib.",
            },
        )
