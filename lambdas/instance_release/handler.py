"""Once a minute: release the GPU instances that run no task (async_inference.instance_release)."""

from __future__ import annotations

import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.aws import client
from async_inference.config import ENV_WORKER_CLUSTER
from async_inference.instance_release import capacity_groups, release_empty_instances

logger = Logger()
tracer = Tracer()
CLUSTER = os.environ[ENV_WORKER_CLUSTER]
ecs = client("ecs")  # through the adapter module: the project's retry settings, and boto3 imported in one place
autoscaling = client("autoscaling")


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    released: list[str] = []
    kept: list[str] = []
    for group in capacity_groups(ecs, CLUSTER):
        done = release_empty_instances(ecs, autoscaling, cluster=CLUSTER, group=group)
        released += done.released
        kept += done.kept
    return {"released": released, "kept": kept}
