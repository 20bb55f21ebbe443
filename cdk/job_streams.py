"""The job event log: streamed jobs' text, appended by the workers while they decode, read by the API to stream it."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from async_inference.config import ENV_STREAM_TABLE
from async_inference.streaming import log


class JobStreams(Construct):
    """An on-demand DynamoDB table of log segments (``async_inference.streaming.log``: partition key ``job_id``,
    numeric sort key ``seq``), each expiring a day after it was written (TTL ``expires_at``).

    The table's stream (new images) carries each segment to the WebSocket API's delta push (``WebSocketPush``), so a
    subscriber gets the text as the workers write it with no other request of theirs.

    On demand, because streams come and go with interactive traffic and a provisioned table would be paid while the
    service sits at zero; DynamoDB and not S3, because a segment costs one write unit ($0.625 a million) where a PUT
    costs $5 a million, and a reader's poll is a Query on the key (docs/streaming.md has the cost per thousand tokens).

    :param removal_policy: what ``cdk destroy`` does with the table. Default: ``RemovalPolicy.DESTROY``: it holds at
        most a day of streamed text, every job's result being in the claim-check bucket, so a delete leaves it not.
    """

    def __init__(self, scope: Construct, id: str, *, removal_policy: RemovalPolicy = RemovalPolicy.DESTROY) -> None:
        super().__init__(scope, id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=log.PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=log.SORT_KEY, type=dynamodb.AttributeType.NUMBER),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=log.TTL_ATTRIBUTE,
            stream=dynamodb.StreamViewType.NEW_IMAGE,
            removal_policy=removal_policy,
        )

    @property
    def environment(self) -> dict[str, str]:
        """The variable the workers and the API find the table by."""
        return {ENV_STREAM_TABLE: self.table.table_name}

    def grant_append(self, grantee: iam.IGrantable) -> iam.Grant:
        """dynamodb:PutItem only: a worker appends segments, it never reads or changes one."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["dynamodb:PutItem"], resource_arns=[self.table.table_arn]
        )

    def grant_follow(self, grantee: iam.IGrantable) -> iam.Grant:
        """dynamodb:Query only: a reader reads a job's segments after the last it has."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["dynamodb:Query"], resource_arns=[self.table.table_arn]
        )
