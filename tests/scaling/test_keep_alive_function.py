"""lambdas/keep_alive: the deployed function against moto's CloudWatch, reading the queue's sends and publishing."""

from __future__ import annotations

import datetime as dt
import importlib
import json
from collections.abc import Iterator
from types import ModuleType

import boto3
import pytest
from moto import mock_aws

from async_inference import settings
from async_inference.keep_alive import (
    ENV_KEEP_ALIVE_CLUSTER,
    ENV_KEEP_ALIVE_POLICY,
    ENV_KEEP_ALIVE_QUEUES,
    ENV_KEEP_ALIVE_SERVICE,
    METRIC_KEEP_WARM,
    KeepAlivePolicy,
)
from local_runtime.lambda_host import Context

POLICY = KeepAlivePolicy(cold_start_s=120.0, cold_start_gpu_s=600.0, wait_price=0.0, alarm_s=0.0, window_minutes=60)


@pytest.fixture
def function(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for name, value in {
        ENV_KEEP_ALIVE_POLICY: POLICY.to_json(),
        ENV_KEEP_ALIVE_QUEUES: json.dumps([["jobs", 1], ["lane", 100]]),
        ENV_KEEP_ALIVE_SERVICE: "gpu-workers",
        ENV_KEEP_ALIVE_CLUSTER: "cluster",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_TRACE_DISABLED": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield importlib.reload(importlib.import_module("lambdas.keep_alive.handler"))


def sent(queue: str, minutes_ago: list[int], value: float = 1.0) -> None:
    """NumberOfMessagesSent of ``queue`` at each of ``minutes_ago``, as SQS publishes it."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    boto3.client("cloudwatch").put_metric_data(
        Namespace="AWS/SQS",
        MetricData=[
            {
                "MetricName": "NumberOfMessagesSent",
                "Dimensions": [{"Name": "QueueName", "Value": queue}],
                "Timestamp": now - dt.timedelta(minutes=m, seconds=-30),
                "Value": value,
                "Unit": "Count",
            }
            for m in minutes_ago
        ],
    )


def published_keep_warm() -> list[float]:
    stats = boto3.client("cloudwatch").get_metric_statistics(
        Namespace=settings.METRICS_NAMESPACE,
        MetricName=METRIC_KEEP_WARM,
        Dimensions=[{"Name": "ServiceName", "Value": "gpu-workers"}],
        StartTime=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5),
        EndTime=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )
    return [p["Maximum"] for p in stats["Datapoints"]]


def test_short_pauses_on_the_queue_publish_keep_warm(function):
    # GIVEN a job sent every 4 minutes for the last 40 minutes (3-minute pauses), the last one 2 minutes ago WHEN the
    # function runs THEN it learns from the queue's sends and publishes KeepWarm 1 for the worker service
    sent("jobs", list(range(42, 1, -4)))
    decision = function.lambda_handler({}, Context(timeout_s=30))
    assert decision["source"] == "histogram" and decision["idle_periods"] >= 5
    assert decision["keep_warm"]
    assert published_keep_warm() == [1.0]


def test_a_queue_quiet_for_the_window_publishes_let_go(function):
    # GIVEN no message sent in the window WHEN the function runs THEN KeepWarm 0: the Idle alarm may take the task
    decision = function.lambda_handler({}, Context(timeout_s=30))
    assert not decision["keep_warm"]
    assert published_keep_warm() == [0.0]


def test_each_queue_counts_at_its_weight(function):
    # GIVEN one message on the batch lane (a chunk of 100 jobs) WHEN the function reads the minutes THEN it counts 100
    sent("lane", [3])
    minutes = function.sent_minutes(dt.datetime.now(dt.UTC))
    assert sum(m or 0 for m in minutes) == 100
