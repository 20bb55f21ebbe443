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
                # Files and batch parts: as long as their records (the batch table's TTL).
                *(
                    s3.LifecycleRule(
                        id=f"expire-{prefix.rstrip('/')}",
                        prefix=prefix,
                        expiration=Duration.days(settings.FILE_RETENTION_DAYS),
                    )
                    for prefix in (settings.FILE_PREFIX, settings.BATCH_PREFIX)
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

    def grant_get(self, grantee: iam.IGrantable, *prefixes: str, missing_as_404: bool = True) -> None:
        """s3:GetObject on the keys under ``prefixes`` and, with ``missing_as_404``, s3:ListBucket limited to them.

        S3 answers a GetObject of a missing key with 404 NoSuchKey only to a caller allowed s3:ListBucket on the
        bucket, and with 403 AccessDenied otherwise (the GetObject API reference); the code reads 404 as "missing"
        (a job that can never run fails with a reason) and anything else as an infrastructure fault. ListBucket is
        granted only with ``s3:prefix`` under these prefixes, so the principal cannot list other payloads. Whether
        S3 evaluates that condition against the key of a failed GET is not documented, so ``aws.Blobs.get`` also
        settles a 403 with a ListObjectsV2 on the key itself (which this condition does allow): a key the listing
        does not show is missing. Without ``missing_as_404``: GetObject only (presigned GETs for clients).
        """
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:GetObject"],
            resource_arns=[self.bucket.arn_for_objects(f"{prefix}*") for prefix in prefixes],
        )
        if missing_as_404:
            grantee.grant_principal.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[self.bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in prefixes]}},
                )
            )

    def grant_put(self, grantee: iam.IGrantable, *prefixes: str) -> iam.Grant:
        """s3:PutObject on the keys under ``prefixes`` (also what a presigned PUT signed by the grantee needs)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:PutObject"],
            resource_arns=[self.bucket.arn_for_objects(f"{prefix}*") for prefix in prefixes],
        )

    def grant_delete(self, grantee: iam.IGrantable, *prefixes: str) -> iam.Grant:
        """s3:DeleteObject on the keys under ``prefixes`` (a delete marker: the bucket is versioned)."""
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["s3:DeleteObject"],
            resource_arns=[self.bucket.arn_for_objects(f"{prefix}*") for prefix in prefixes],
        )

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
