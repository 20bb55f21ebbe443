"""Deliver queue messages to Lambda handlers the way Lambda's event sources do, for the local runtime."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Callable

from async_inference.aws import client
from local_runtime.lambda_env import LocalLambdaContext, sqs_event

logger = logging.getLogger("local_runtime")
Handler = Callable[[dict[str, Any], Any], Any]


class QueuePoller(threading.Thread):
    """Long-polls ``queue_url`` and hands what it receives to ``deliver``; deletes what ``deliver`` says is done."""

    def __init__(self, name: str, queue_url: str, deliver: Callable[[list[dict[str, Any]]], list[str]]) -> None:
        super().__init__(name=name, daemon=True)
        self.queue_url = queue_url
        self._deliver = deliver
        self._sqs = client("sqs")
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                messages = self._sqs.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["All"]
                ).get("Messages", [])
                if not messages:
                    continue
                done = self._deliver(messages)
                entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(done)]
                if entries:
                    self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
            except Exception:
                if not self._stop.is_set():
                    logger.exception("%s: delivery failed; the messages will be redelivered", self.name)
                    self._stop.wait(1)

    def stop(self) -> None:
        self._stop.set()


def s3_events_to(handler: Handler) -> Callable[[list[dict[str, Any]]], list[str]]:
    """S3 notifications that moto put on a queue, delivered to ``handler`` as S3 invokes a Lambda (one event each)."""

    def deliver(messages: list[dict[str, Any]]) -> list[str]:
        done = []
        for message in messages:
            event = json.loads(message["Body"])
            if "Records" in event:  # moto also sends an "s3:TestEvent" when the notification is configured
                handler(event, LocalLambdaContext(function_name="upload"))
            done.append(message["ReceiptHandle"])
        return done

    return deliver


def sqs_batches_to(handler: Handler, queue_arn: str) -> Callable[[list[dict[str, Any]]], list[str]]:
    """Messages delivered as an SQS event-source batch; the ones the handler reports as failures stay on the queue."""

    def deliver(messages: list[dict[str, Any]]) -> list[str]:
        response = handler(sqs_event(messages, queue_arn), LocalLambdaContext(function_name="dlq")) or {}
        failed = {f["itemIdentifier"] for f in response.get("batchItemFailures", [])}
        return [m["ReceiptHandle"] for m in messages if m["MessageId"] not in failed]

    return deliver
