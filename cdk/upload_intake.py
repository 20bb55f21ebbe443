"""Upload intake: a presigned upload landing in the bucket queues its job."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from constructs import Construct

from async_inference import settings
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge

NOTIFICATIONS_HANDLER_ID = "BucketNotificationsHandler050a0587b7544547bf325f094a3db834"


class UploadIntake(Construct):
    """The upload Lambda and the S3 ObjectCreated notification on ``settings.UPLOAD_PREFIX`` that triggers it.

    Inline bodies are written under ``settings.REQUEST_PREFIX`` by the API, so they never trigger this function.

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
            timeout=Duration.seconds(60),
        )
        bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.LambdaDestination(self.handler),
            s3.NotificationKeyFilter(prefix=settings.UPLOAD_PREFIX),
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
