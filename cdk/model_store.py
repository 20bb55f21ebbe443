"""The model's weights in S3: a bucket the stack creates, or an existing bucket and prefix, read by the workers."""

from __future__ import annotations

import re

from aws_cdk import RemovalPolicy, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from async_inference.config import ENV_MODEL_DIR, ENV_MODEL_S3_URI
from cdk.nag import acknowledge

# s3://bucket/ or s3://bucket/prefix/ (the prefix a "directory": it ends with "/").
S3_URI_PATTERN = r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/((?:[^/]+/)*)$"


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket/prefix/``; ValueError naming the expected form otherwise."""
    match = re.match(S3_URI_PATTERN, uri)
    if not match:
        raise ValueError(f"{uri!r} is not s3://<bucket>/<prefix>/ (a bucket name, and a prefix that ends with '/')")
    return match.group(1), match.group(2)


class ModelStore(Construct):
    """Where the workers get the model's files (config, tokenizer, weights) instead of the Hugging Face Hub.

    The worker syncs ``s3_uri`` into ``model_dir`` at start (``MODEL_S3_URI`` and ``MODEL_DIR``, the contract in
    ``async_inference.config``) and vLLM loads from there. ``model_dir`` lies under the workers' ``/models`` host
    volume, so a task restarted on the same instance finds the files and copies only what changed. The S3 gateway
    endpoint of the workers' VPC carries the copy, not the NAT gateway (for a bucket in the stack's region).

    :param model: the model's name; the created bucket's prefix is ``<model>/``.
    :param models_path: the container path of the workers' model volume. Default: ``/models``.
    :param existing_uri: ``s3://bucket/prefix/`` of weights uploaded already (a bucket encrypted with SSE-S3 or the
        ``aws/s3`` key). Default: none, the stack creates a private, encrypted, TLS-only bucket.
    :param access_logs: bucket for the created bucket's server access logs (under ``models/``). Required without
        ``existing_uri``.
    :param removal_policy: what ``cdk destroy`` does with a created bucket. Default: ``RemovalPolicy.RETAIN``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        model: str,
        models_path: str = "/models",
        existing_uri: str | None = None,
        access_logs: s3.IBucket | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        self.created = existing_uri is None
        if existing_uri is not None:
            name, self.prefix = parse_s3_uri(existing_uri)
            self.bucket: s3.IBucket = s3.Bucket.from_bucket_name(self, "Bucket", name)
        else:
            if access_logs is None:
                raise ValueError("access_logs is required when the stack creates the model bucket (no existing_uri)")
            self.prefix = f"{model.strip('/')}/"
            self.bucket = s3.Bucket(
                self,
                "Bucket",
                block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                encryption=s3.BucketEncryption.S3_MANAGED,
                enforce_ssl=True,
                server_access_logs_bucket=access_logs,
                server_access_logs_prefix="models/",
                removal_policy=removal_policy,
                auto_delete_objects=removal_policy == RemovalPolicy.DESTROY,
            )
        self.s3_uri = f"s3://{self.bucket.bucket_name}/{self.prefix}"
        self.model_dir = f"{models_path}/s3/{self.bucket.bucket_name}/{self.prefix}".rstrip("/")
        self.environment = {ENV_MODEL_S3_URI: self.s3_uri, ENV_MODEL_DIR: self.model_dir}

    def grant_read(self, grantee: iam.IGrantable) -> None:
        """s3:GetObject on the keys under the prefix, and s3:ListBucket only for that prefix: what a sync calls (list,
        then get each file), and nothing else in the bucket."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetObject"], resource_arns=[self.bucket.arn_for_objects(f"{self.prefix}*")]
        )
        stack = Stack.of(self)
        if self.created:
            objects = f"<{stack.get_logical_id(self.bucket.node.default_child)}.Arn>/{self.prefix}*"
        else:
            partition = "<AWS::Partition>" if Token.is_unresolved(stack.partition) else stack.partition
            objects = f"arn:{partition}:s3:::{self.bucket.bucket_name}/{self.prefix}*"
        acknowledge(
            grantee.grant_principal,
            {f"AwsSolutions-IAM5[Resource::{objects}]": "The model's files: every key under its prefix, read-only."},
        )
        # A whole-bucket model (no prefix) lists without a Prefix, and a condition on an absent key never holds.
        conditions = {"StringLike": {"s3:prefix": [f"{self.prefix}*"]}} if self.prefix else None
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn], conditions=conditions)
        )
