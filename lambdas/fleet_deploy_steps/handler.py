"""The GPU fleets' custom resources (async_inference.fleet_deploy_steps), answered to CloudFormation.

The function is the resources' ServiceToken itself (no provider framework): it PUTs its answer to the request's
presigned ``ResponseURL``. It always answers, FAILED with the reason when the step raised: a custom resource that
never answers keeps CloudFormation waiting an hour.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference.aws import client
from async_inference.fleet_deploy_steps import StepResult, handle

logger = Logger()
tracer = Tracer()
ecs = client("ecs")
autoscaling = client("autoscaling")


def response_body(event: dict[str, Any], result: StepResult | None, reason: str = "") -> dict[str, Any]:
    """CloudFormation's custom resource response: SUCCESS with the step's data, or FAILED with ``reason``."""
    return {
        "Status": "SUCCESS" if result is not None else "FAILED",
        "Reason": reason or "see the function's log",
        "PhysicalResourceId": result.physical_id if result else event.get("PhysicalResourceId", event["RequestId"]),
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
        "Data": result.data if result else {},
    }


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> None:
    try:
        body = response_body(event, handle(event, ecs=ecs, autoscaling=autoscaling))
    except Exception as exc:
        logger.exception("custom resource step failed")
        body = response_body(event, None, f"{type(exc).__name__}: {exc}")
    data = json.dumps(body).encode()
    # The presigned URL is signed for an empty Content-Type.
    request = urllib.request.Request(event["ResponseURL"], data=data, method="PUT", headers={"Content-Type": ""})
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (CloudFormation's https URL)
        logger.info("answered CloudFormation", extra={"status": body["Status"], "http_status": answer.status})
