"""The job table: one item per job, listed per tenant through a secondary index."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from async_inference import settings


class JobTable(Construct):
    """An on-demand DynamoDB table with point-in-time recovery, TTL on finished jobs and the tenant listing index.

    Key names come from ``settings`` (the code writes the same attributes). The code sets the TTL attribute only when
    a job becomes final, so DynamoDB never expires a job that is still queued or running.

    :param removal_policy: what ``cdk destroy`` does with the table. Default: ``RemovalPolicy.RETAIN``.
    """

    def __init__(self, scope: Construct, id: str, *, removal_policy: RemovalPolicy = RemovalPolicy.RETAIN) -> None:
        super().__init__(scope, id)
        string = dynamodb.AttributeType.STRING
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=settings.TABLE_PARTITION_KEY, type=string),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=settings.TABLE_TTL_ATTRIBUTE,
            removal_policy=removal_policy,
        )
        # The list endpoint: a tenant's jobs, newest first (the sort key starts with the ISO creation time).
        self.table.add_global_secondary_index(
            index_name=settings.TENANT_INDEX_NAME,
            partition_key=dynamodb.Attribute(name=settings.TENANT_INDEX_PARTITION_KEY, type=string),
            sort_key=dynamodb.Attribute(name=settings.TENANT_INDEX_SORT_KEY, type=string),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        # Quotas: a sparse index holding exactly the unfinished jobs (the code sets its key on a new job and removes
        # it in the write that makes the job final), counted per tenant at submit. Keys only: a count reads no more.
        self.table.add_global_secondary_index(
            index_name=settings.ACTIVE_JOBS_INDEX_NAME,
            partition_key=dynamodb.Attribute(name=settings.ACTIVE_JOBS_ATTRIBUTE, type=string),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )

    def grant_items(self, grantee: iam.IGrantable, *actions: str) -> iam.Grant:
        """Item-level ``actions`` (GetItem, PutItem, UpdateItem, BatchGetItem) on the table itself, not its index.

        Not ``grant_read_write_data``: that adds Scan, DeleteItem and BatchWriteItem, which no component calls.
        """
        return iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=[self.table.table_arn])

    def grant_tenant_listing(self, grantee: iam.IGrantable) -> iam.Grant:
        """dynamodb:Query on the tenant index (the list endpoint) and the unfinished-jobs index (quotas) only."""
        indexes = [
            f"{self.table.table_arn}/index/{name}"
            for name in (settings.TENANT_INDEX_NAME, settings.ACTIVE_JOBS_INDEX_NAME)
        ]
        return iam.Grant.add_to_principal(grantee=grantee, actions=["dynamodb:Query"], resource_arns=indexes)
