"""Once a minute: whether the GPU workers' last task is kept warm, from the queues' arrivals
(async_inference.keep_alive), published as the metric the keep-alive alarm reads."""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.aws import client
from async_inference.keep_alive import (
    ENV_KEEP_ALIVE_POLICY,
    ENV_KEEP_ALIVE_QUEUES,
    ENV_KEEP_ALIVE_SERVICE,
    METRIC_BREAK_EVEN_S,
    METRIC_KEEP_ALIVE_S,
    METRIC_KEEP_WARM,
    KeepAlivePolicy,
    decide,
)

logger = Logger()
tracer = Tracer()
POLICY = KeepAlivePolicy.from_json(os.environ[ENV_KEEP_ALIVE_POLICY])
QUEUES: list[tuple[str, float]] = [
    (name, float(weight)) for name, weight in json.loads(os.environ[ENV_KEEP_ALIVE_QUEUES])
]
SERVICE = os.environ[ENV_KEEP_ALIVE_SERVICE]
cloudwatch = client("cloudwatch")


def sent_minutes(now: dt.datetime) -> list[float | None]:
    """Messages sent per minute over the policy's window, oldest first, each queue at its weight; None for a minute
    no queue published."""
    end = now.replace(second=0, microsecond=0)
    start = end - dt.timedelta(minutes=POLICY.window_minutes)
    queries = [
        {
            "Id": f"sent{i}",
            "MetricStat": {
                "Metric": {
                    "Namespace": "AWS/SQS",
                    "MetricName": "NumberOfMessagesSent",
                    "Dimensions": [{"Name": "QueueName", "Value": name}],
                },
                "Period": 60,
                "Stat": "Sum",
            },
        }
        for i, (name, _) in enumerate(QUEUES)
    ]
    minutes: list[float | None] = [None] * POLICY.window_minutes
    pages = cloudwatch.get_paginator("get_metric_data").paginate(
        MetricDataQueries=queries, StartTime=start, EndTime=end
    )
    for page in pages:
        for result in page["MetricDataResults"]:
            weight = QUEUES[int(result["Id"].removeprefix("sent"))][1]
            for stamp, value in zip(result["Timestamps"], result["Values"], strict=True):
                index = int((stamp - start).total_seconds() // 60)
                if 0 <= index < len(minutes):
                    minutes[index] = (minutes[index] or 0.0) + weight * value
    return minutes


@logger.inject_lambda_context
@tracer.capture_lambda_handler(capture_response=False)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    decision = decide(POLICY, sent_minutes(now))
    dimensions = [{"Name": "ServiceName", "Value": SERVICE}]
    cloudwatch.put_metric_data(
        Namespace=settings.METRICS_NAMESPACE,
        MetricData=[
            {"MetricName": name, "Dimensions": dimensions, "Timestamp": now, "Value": value, "Unit": unit}
            for name, value, unit in (
                (METRIC_KEEP_WARM, float(decision.keep_warm), "Count"),
                (METRIC_KEEP_ALIVE_S, decision.keep_alive_s, "Seconds"),
                (METRIC_BREAK_EVEN_S, decision.break_even_s, "Seconds"),
            )
        ],
    )
    logger.info("keep-alive decision", extra={"decision": decision.__dict__})
    return decision.__dict__
