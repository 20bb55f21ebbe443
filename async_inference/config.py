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
# The upload-deadline queue: the API schedules each upload job's expiry there; its handler expires late uploads.
ENV_UPLOAD_DEADLINES_QUEUE_URL = "UPLOAD_DEADLINES_QUEUE_URL"
# "1" only in the local runtime: lets webhooks target http://127.0.0.1 (never set in the stack).
ENV_ALLOW_LOCAL_WEBHOOKS = "ALLOW_LOCAL_WEBHOOKS"
# The worker container (set by the task definition; the worker refuses to start without ENGINE).
ENV_ENGINE = "ENGINE"
ENV_MODEL = "MODEL"
# s3://bucket/prefix/ holding the model's files (config, tokenizer, weights): synced to MODEL_DIR at start, and vLLM
# loads from there. Unset: MODEL is a Hugging Face id (HF_TOKEN, from a secret, for gated models) or a local path.
ENV_MODEL_S3_URI = "MODEL_S3_URI"
ENV_MODEL_DIR = "MODEL_DIR"
# The worker touches this file while its loops run; the container health check (`python3 -m gpu_worker.health`)
# fails when it is older than HEALTH_MAX_AGE_S.
ENV_HEALTH_FILE = "WORKER_HEALTH_FILE"
DEFAULT_HEALTH_FILE = "/tmp/gpu-worker-health"
ENV_HEALTH_MAX_AGE_S = "HEALTH_MAX_AGE_S"


@dataclass(frozen=True)
class ServiceConfig:
    """Where the service's resources are. Every deployed component reads the same variables."""

    table_name: str
    bucket_name: str
    queue_url: str
    topic_arn: str
    dlq_url: str | None = None
    # Unset: no upload job gets a scheduled expiry; a GET after its window still expires it.
    upload_deadlines_queue_url: str | None = None

    @classmethod
    def from_env(cls) -> ServiceConfig:
        # os.environ[...] on purpose: a missing setting fails at start-up, not on the first request.
        return cls(
            table_name=os.environ[ENV_TABLE],
            bucket_name=os.environ[ENV_BUCKET],
            queue_url=os.environ[ENV_QUEUE_URL],
            topic_arn=os.environ[ENV_TOPIC_ARN],
            dlq_url=os.environ.get(ENV_DLQ_URL),
            upload_deadlines_queue_url=os.environ.get(ENV_UPLOAD_DEADLINES_QUEUE_URL),
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
        if self.upload_deadlines_queue_url:
            env[ENV_UPLOAD_DEADLINES_QUEUE_URL] = self.upload_deadlines_queue_url
        return env
