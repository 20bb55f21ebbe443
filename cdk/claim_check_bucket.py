"""The claim-check bucket: request bodies, presigned uploads and results, each under its own prefix."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from async_inference import settings
from cdk.nag import acknowledge


class ClaimCheckBucket(Construct):
    """A private, TLS-only, encrypted, versioned bucket whose payloads expire.

    Versioning protects results against an accidental overwrite or delete; old versions go a day after they stop
    being current. Object lock is not used: the service deletes uploads once processed and expires everything after
    ``retention_days``, which a lock would forbid.

    :param retention_days: days after which requests, uploads and results expire. Default:
        ``settings.PAYLOAD_RETENTION_DAYS``.
    :param cors_allowed_origins: origins allowed to PUT presigned uploads from a browser; empty disables CORS.
        Default: ``("*",)`` (the presigned URL is the authorization).
    :param removal_policy: what ``cdk destroy`` does with the bucket. Default: ``RemovalPolicy.RETAIN``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        retention_days: int = settings.PAYLOAD_RETENTION_DAYS,
        cors_allowed_origins: Sequence[str] = ("*",),
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(90))],
            removal_policy=removal_policy,
            auto_delete_objects=removal_policy == RemovalPolicy.DESTROY,
        )
        acknowledge(
            self.access_logs,
            {"AwsSolutions-S1": "This is the access log bucket; logging it into itself would loop."},
        )
        expire = Duration.days(retention_days)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            # SSE-S3, not KMS: presigned PUTs from clients then need no key permission and no encryption headers.
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            versioned=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="claim-checks/",
            lifecycle_rules=[
                *(
                    s3.LifecycleRule(id=f"expire-{prefix.rstrip('/')}", prefix=prefix, expiration=expire)
                    for prefix in (settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX)
                ),
                s3.LifecycleRule(
                    id="tidy-versions-and-uploads",
                    noncurrent_version_expiration=Duration.days(1),
                    abort_incomplete_multipart_upload_after=Duration.days(1),
                    expired_object_delete_marker=True,
                ),
            ],
            cors=[
                s3.CorsRule(
                    allowed_methods=[s3.HttpMethods.PUT],
                    allowed_origins=list(cors_allowed_origins),
                    allowed_headers=["Content-Type", "Content-Length"],
                    max_age=3000,
                )
            ]
            if cors_allowed_origins
            else None,
            removal_policy=removal_policy,
            auto_delete_objects=removal_policy == RemovalPolicy.DESTROY,
        )
        self._refuse_stale_presigned_urls()

    def _refuse_stale_presigned_urls(self) -> None:
        # The code presigns for at most these expiries; the bucket enforces the same limits, so a URL presigned with a
        # longer expiry (a bug, or a leaked signing key) stops working when the API contract says it does.
        for prefix, action, expiry_s in (
            (settings.UPLOAD_PREFIX, "s3:PutObject", settings.PRESIGNED_UPLOAD_EXPIRY_S),
            (settings.RESULT_PREFIX, "s3:GetObject", settings.PRESIGNED_RESULT_EXPIRY_S),
        ):
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=f"PresignedExpiry{prefix.rstrip('/').capitalize()}",
                    effect=iam.Effect.DENY,
                    principals=[iam.AnyPrincipal()],
                    actions=[action],
                    resources=[self.bucket.arn_for_objects(f"{prefix}*")],
                    conditions={"NumericGreaterThan": {"s3:signatureAge": expiry_s * 1000}},
                )
            )
