"""Batches (docs/design/batches.md): the batch table, the control queue and the controller (each model's batch lane is
its fleet's, cdk.model_fleet)."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_event_sources as event_sources
from constructs import Construct

from async_inference import settings
from async_inference.config import ENV_BATCH_CONTROL_QUEUE_URL, ENV_BATCH_TABLE
from cdk.job_queue import secure_dead_letter_queue, secure_queue
from cdk.lambda_code import LambdaCode

# A plan streams an input file of up to settings.BATCH_MAX_FILE_BYTES; a finalize concatenates up to
# BATCH_MAX_LINES / BATCH_CHUNK_LINES parts of each kind into one multipart upload. Ten minutes covers both with room.
CONTROLLER_TIMEOUT = Duration.minutes(10)
# Lambda requires a visibility timeout of at least the function timeout; six times leaves room for throttled
# invocations (AWS guidance).
CONTROL_VISIBILITY_TIMEOUT = Duration.minutes(60)
CONTROL_MAX_RECEIVE_COUNT = 5
# Plans and finalizes running at once (the event source's ScalingConfig; 2 is the least Lambda takes): batches have a
# day to finish, and the functions behind the API must keep the account's Lambda concurrency (new accounts get little).
CONTROLLER_MAX_CONCURRENCY = 2


class Batches(Construct):
    """The batch table, the control queue (and its DLQ) and the controller.

    * ``table``: files and batches, one item each (partition key ``settings.BATCH_TABLE_PARTITION_KEY``), listed per
      tenant and kind, newest first, through ``settings.BATCH_OWNER_INDEX_NAME``; records expire
      ``settings.FILE_RETENTION_DAYS`` after creation (TTL). On-demand, encrypted, point-in-time recovery.
    * ``control_queue``: BatchControl messages (plan, from the API; finalize, from the worker that counts a batch's
      last chunk), consumed one at a time by ``controller``; a step failing ``CONTROL_MAX_RECEIVE_COUNT`` times moves
      to ``control_dead_letter_queue``.

    ``environment`` holds the variables the API, the controller and the worker read these by.

    :param code: the shared Lambda code.
    :param environment: the service's runtime configuration and Powertools settings.
    :param removal_policy: what ``cdk destroy`` does with the table. Default: ``RemovalPolicy.RETAIN``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        code: LambdaCode,
        environment: Mapping[str, str],
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        string = dynamodb.AttributeType.STRING
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=settings.BATCH_TABLE_PARTITION_KEY, type=string),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            time_to_live_attribute=settings.BATCH_TTL_ATTRIBUTE,
            removal_policy=removal_policy,
        )
        self.table.add_global_secondary_index(
            index_name=settings.BATCH_OWNER_INDEX_NAME,
            partition_key=dynamodb.Attribute(name=settings.BATCH_OWNER_ATTRIBUTE, type=string),
            sort_key=dynamodb.Attribute(name=settings.BATCH_CREATED_KEY_ATTRIBUTE, type=string),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        # Sparse: only batches not yet final carry the attribute; with their line counts, which the quota adds up.
        self.table.add_global_secondary_index(
            index_name=settings.BATCH_ACTIVE_INDEX_NAME,
            partition_key=dynamodb.Attribute(name=settings.BATCH_ACTIVE_ATTRIBUTE, type=string),
            projection_type=dynamodb.ProjectionType.INCLUDE,
            non_key_attributes=["total"],
        )
        self.control_dead_letter_queue = secure_dead_letter_queue(self, "ControlDeadLetterQueue")
        self.control_queue = secure_queue(
            self,
            "ControlQueue",
            dead_letter_queue=self.control_dead_letter_queue,
            max_receive_count=CONTROL_MAX_RECEIVE_COUNT,
            visibility_timeout=CONTROL_VISIBILITY_TIMEOUT,
        )
        self.environment = {
            ENV_BATCH_TABLE: self.table.table_name,
            ENV_BATCH_CONTROL_QUEUE_URL: self.control_queue.queue_url,
        }
        self.controller = code.new_function(
            self,
            "Controller",
            handler="lambdas.batch_controller.handler.lambda_handler",
            description="Batches: validates and chunks input files, concatenates results into output files",
            service_name="async-inference-batch-controller",
            environment={**environment, **self.environment},
            timeout=CONTROLLER_TIMEOUT,
            memory_size=1024,
        )
        # One step at a time: a plan or a finalize may take minutes, and one failing must not hold back others.
        self.controller.add_event_source(
            event_sources.SqsEventSource(
                self.control_queue,
                batch_size=1,
                report_batch_item_failures=True,
                max_concurrency=CONTROLLER_MAX_CONCURRENCY,
            )
        )

    def grant_items(self, grantee: iam.IGrantable, *actions: str) -> iam.Grant:
        """Item-level ``actions`` on the batch table itself (not ``grant_read_write_data``: no Scan, no
        BatchWriteItem)."""
        return iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=[self.table.table_arn])

    def grant_quota_counts(self, grantee: iam.IGrantable) -> iam.Grant:
        """dynamodb:Query on the index of batches in flight (``max_batch_lines_in_flight``; the stored bytes are read
        through the owner index, ``grant_listing``)."""
        index = f"{self.table.table_arn}/index/{settings.BATCH_ACTIVE_INDEX_NAME}"
        return iam.Grant.add_to_principal(grantee=grantee, actions=["dynamodb:Query"], resource_arns=[index])

    def grant_listing(self, grantee: iam.IGrantable) -> iam.Grant:
        """dynamodb:Query on the owner index only (GET /v1/files, GET /v1/batches)."""
        index = f"{self.table.table_arn}/index/{settings.BATCH_OWNER_INDEX_NAME}"
        return iam.Grant.add_to_principal(grantee=grantee, actions=["dynamodb:Query"], resource_arns=[index])
