"""Runtime configuration, read once from the environment at start-up.

The names of the environment variables are constants here because the CDK stack sets them and the code reads them:
one definition for both sides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_TABLE = "JOBS_TABLE_NAME"
ENV_BUCKET = "JOBS_BUCKET_NAME"
ENV_QUEUE_URL = "JOBS_QUEUE_URL"
ENV_DLQ_URL = "JOBS_DLQ_URL"
ENV_TOPIC_ARN = "RESULT_TOPIC_ARN"
# Standard Webhooks signing secrets: in AWS a Secrets Manager secret holding {"tenant": "whsec_..."}; locally the
# same JSON inline.
ENV_WEBHOOK_SECRET_ARN = "WEBHOOK_SECRET_ARN"
ENV_WEBHOOK_SECRETS_JSON = "WEBHOOK_SECRETS_JSON"
ENV_WEBHOOK_QUEUE_URL = "WEBHOOK_QUEUE_URL"
# "1" only in the local runtime: lets webhooks target http://127.0.0.1 (never set in the stack).
ENV_ALLOW_LOCAL_WEBHOOKS = "ALLOW_LOCAL_WEBHOOKS"


@dataclass(frozen=True)
class ServiceConfig:
    """Where the service's resources are. Every deployed component reads the same variables."""

    table_name: str
    bucket_name: str
    queue_url: str
    topic_arn: str
    dlq_url: str | None = None

    @classmethod
    def from_env(cls) -> ServiceConfig:
        # os.environ[...] on purpose: a missing setting fails at start-up, not on the first request.
        return cls(
            table_name=os.environ[ENV_TABLE],
            bucket_name=os.environ[ENV_BUCKET],
            queue_url=os.environ[ENV_QUEUE_URL],
            topic_arn=os.environ[ENV_TOPIC_ARN],
            dlq_url=os.environ.get(ENV_DLQ_URL),
        )

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_TABLE: self.table_name,
            ENV_BUCKET: self.bucket_name,
            ENV_QUEUE_URL: self.queue_url,
            ENV_TOPIC_ARN: self.topic_arn,
        }
        if self.dlq_url:
            env[ENV_DLQ_URL] = self.dlq_url
        return env
