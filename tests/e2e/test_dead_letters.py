"""The job DLQ's handler on the local stack: a message it cannot process stays in the DLQ for an operator, and is
counted in a metric (the EMF record in the function's log, which CloudWatch turns into the metric)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from async_inference import settings
from async_inference.aws import client

pytestmark = pytest.mark.e2e


def emf_records(stack, metric: str) -> list[dict[str, Any]]:
    records = []
    for line in (stack.log_dir / "functions.log").read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{metric}"' in line:
            record = json.loads(line)
            if any(m["Name"] == metric for d in record["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]):
                records.append(record)
    return records


def messages_in(queue_url: str) -> int:
    attributes = client("sqs").get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_a_dlq_message_that_is_not_a_claim_check_stays_for_an_operator_and_is_counted(stack):
    dlq_url = stack.resources.config.dlq_url
    counted_before = len(emf_records(stack, settings.METRIC_DEAD_LETTERS_UNPROCESSABLE))
    # GIVEN a message in the job DLQ that is not a claim check (a producer's bug, a hand-sent message)
    client("sqs").send_message(QueueUrl=dlq_url, MessageBody='{"not": "a claim check"}')
    try:
        # WHEN the DLQ handler has seen it
        deadline = time.monotonic() + 30
        while len(emf_records(stack, settings.METRIC_DEAD_LETTERS_UNPROCESSABLE)) == counted_before:
            assert time.monotonic() < deadline, "the DLQ handler never counted the message"
            time.sleep(0.5)
        # THEN it was counted once, in the service's namespace, and is still in the DLQ
        [record] = emf_records(stack, settings.METRIC_DEAD_LETTERS_UNPROCESSABLE)[counted_before:]
        assert record["_aws"]["CloudWatchMetrics"][0]["Namespace"] == settings.METRICS_NAMESPACE
        assert record[settings.METRIC_DEAD_LETTERS_UNPROCESSABLE] == [1.0]
        time.sleep(1)  # the local event source deletes what the handler did not report as failed right after it
        assert messages_in(dlq_url) == 1
    finally:
        client("sqs").purge_queue(QueueUrl=dlq_url)
