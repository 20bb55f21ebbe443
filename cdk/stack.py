"""The deployable stack: the service construct and the outputs operators need."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from cdk.options import AsyncInferenceServiceProps
from cdk.service import AsyncInferenceService


class AsyncInferenceStack(Stack):
    """Places :class:`AsyncInferenceService` and exports where its endpoints and resources are."""

    def __init__(self, scope: Construct, id: str, *, props: AsyncInferenceServiceProps, **stack_kwargs: Any) -> None:
        super().__init__(scope, id, **stack_kwargs)
        self.service = AsyncInferenceService(self, "Service", props=props)
        s = self.service
        # The first model's resources keep the output names a one-model stack gave them (scripts read them).
        first = s.fleets[0]
        store = s.models[first.spec.name]
        outputs = {
            "ApiUrl": s.api.api.url,
            "BucketName": s.bucket.bucket.bucket_name,
            "QueueUrl": first.jobs.queue.queue_url,
            "DeadLetterQueueUrl": first.jobs.dead_letter_queue.queue_url,
            "TableName": s.table.table.table_name,
            "ResultTopicArn": s.results.topic.topic_arn,
            # {"tenant": "<ARN>"}: `python -m async_inference.cli webhook-secret TENANT --secret-arns '<this>'`
            # prints its secret.
            "WebhookSigningSecretArns": s.webhooks.secret_arns_json,
            "WebhookDeadLetterQueueUrl": s.webhooks.dead_letter_queue.queue_url,
            "DashboardName": s.monitoring.dashboard.dashboard_name,
            "BatchTableName": s.batches.table.table_name,
            "BatchQueueUrl": first.lane_queue.queue_url,
            "BatchControlQueueUrl": s.batches.control_queue.queue_url,
        }
        if s.push is not None:
            outputs["WebSocketUrl"] = s.push.url
            outputs["ConnectionTableName"] = s.push.connections.table_name
            outputs["JobEventTopicArn"] = s.push.events_topic.topic_arn
        if store is not None:
            # Where the workers read the weights: `aws s3 sync <local model directory> <ModelS3Uri>` uploads them.
            outputs["ModelS3Uri"] = store.s3_uri
            if store.created:
                outputs["ModelBucketName"] = store.bucket.bucket_name
        for name, value in outputs.items():
            CfnOutput(self, name, value=value)
        for tenant, keys in s.api.api_keys.items():
            # The key's value stays in API Gateway: `aws apigateway get-api-key --api-key <id> --include-value`.
            for index, key in enumerate(keys):
                suffix = "" if index == 0 else str(index + 1)  # the first key keeps the output name it always had
                CfnOutput(
                    self,
                    f"ApiKeyId{tenant.replace('-', '')}{suffix}",
                    value=key.key_id,
                    description=f"API key of {tenant}",
                )
