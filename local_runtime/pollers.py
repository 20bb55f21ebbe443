"""How Lambda's event sources deliver to functions, for the local runtime, read from the template.

* ``SqsEventSource``: an ``AWS::Lambda::EventSourceMapping`` on a queue. Batches of up to ``BatchSize``; with
  ``ReportBatchItemFailures`` only the reported records stay on the queue, without it a function error leaves the
  whole batch to come back after the queue's visibility timeout, as in AWS.
* ``DynamoDbStreamSource`` (``local_runtime.dynamodb_streams``): an event source mapping on a table's stream.
* ``AsyncInvoker``: asynchronous invocation (S3 notifications, SNS subscriptions). Lambda queues such events
  internally; here the deployer points the notification at a local queue instead (see
  ``Deployment.async_event_queue``). A failed invocation is retried ``MaximumRetryAttempts`` times (the function's
  ``AWS::Lambda::EventInvokeConfig``, default 2), then the event goes to the on-failure destination if there is one,
  and is dropped otherwise, as Lambda does. Lambda waits about a minute, then two, between the attempts; locally the
  waits are ``LOCAL_RETRY_DELAYS_S``. The events of a batch received from that queue are invoked concurrently, one
  per execution environment of the function, as Lambda runs asynchronous invocations side by side: one at a time,
  the push function (two events a job) fell behind the soak, and its event queue grew by thousands.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from local_runtime.deployer import Deployment
from local_runtime.dynamodb_streams import DynamoDbStreamSource
from local_runtime.functions import InvokeResult, LocalFunction
from local_runtime.template import LOCAL_REGION

logger = logging.getLogger("local_runtime")
LOCAL_RETRY_DELAYS_S = (1, 2)
DEFAULT_ASYNC_RETRIES = 2


class _Poller(threading.Thread):
    """Long-polls a queue until stopped, handing each batch to ``handle``."""

    def __init__(self, name: str, sqs: Any, queue_url: str, batch_size: int = 10) -> None:
        super().__init__(name=name, daemon=True)
        self.queue_url = queue_url
        self._sqs = sqs
        self._batch_size = max(1, min(batch_size, 10))
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                messages = self._sqs.receive_message(
                    QueueUrl=self.queue_url,
                    MaxNumberOfMessages=self._batch_size,
                    WaitTimeSeconds=1,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
                if messages:
                    self.handle(messages)
            except Exception:
                if not self._stopping.is_set():
                    logger.exception("%s: delivery failed; the messages will be redelivered", self.name)
                    self._stopping.wait(1)

    def handle(self, messages: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def delete(self, receipt_handles: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(receipt_handles)]
        if entries:
            self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)

    def stop(self) -> None:
        self._stopping.set()


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """The event an SQS event source mapping delivers for ``messages`` (as ReceiveMessage returned them)."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {
                    name: {
                        "stringValue": value.get("StringValue"),
                        "binaryValue": value.get("BinaryValue"),
                        "stringListValues": [],
                        "binaryListValues": [],
                        "dataType": value["DataType"],
                    }
                    for name, value in m.get("MessageAttributes", {}).items()
                },
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": LOCAL_REGION,
            }
            for m in messages
        ]
    }


class SqsEventSource(_Poller):
    def __init__(
        self,
        sqs: Any,
        function: LocalFunction,
        *,
        queue_url: str,
        queue_arn: str,
        batch_size: int,
        report_batch_item_failures: bool,
    ) -> None:
        super().__init__(f"esm-{function.logical_id}", sqs, queue_url, batch_size)
        self.function = function
        self.queue_arn = queue_arn
        self.report_batch_item_failures = report_batch_item_failures

    def handle(self, messages: list[dict[str, Any]]) -> None:
        result = self.function.invoke(sqs_event(messages, self.queue_arn))
        if result.error:
            logger.warning(
                "%s failed on a batch of %d: %s; it returns after the visibility timeout",
                self.function.logical_id,
                len(messages),
                result.payload.get("errorMessage"),
            )
            return
        failed: set[str] = set()
        if self.report_batch_item_failures and isinstance(result.payload, dict):
            failed = {f["itemIdentifier"] for f in result.payload.get("batchItemFailures", [])}
        self.delete([m["ReceiptHandle"] for m in messages if m["MessageId"] not in failed])


def _sns_event(envelope: dict[str, Any], subscription_arn: str) -> dict[str, Any]:
    """The event Lambda receives from an SNS subscription, from the envelope SNS delivered to the local queue."""
    return {
        "Records": [
            {
                "EventVersion": "1.0",
                "EventSubscriptionArn": subscription_arn,
                "EventSource": "aws:sns",
                "Sns": {
                    "Type": envelope.get("Type", "Notification"),
                    "MessageId": envelope.get("MessageId"),
                    "TopicArn": envelope.get("TopicArn"),
                    "Subject": envelope.get("Subject"),
                    "Message": envelope.get("Message"),
                    "Timestamp": envelope.get("Timestamp"),
                    "SignatureVersion": envelope.get("SignatureVersion", "1"),
                    "Signature": envelope.get("Signature", ""),
                    "SigningCertUrl": envelope.get("SigningCertURL", ""),
                    "UnsubscribeUrl": envelope.get("UnsubscribeURL", ""),
                    "MessageAttributes": envelope.get("MessageAttributes", {}),
                },
            }
        ]
    }


class AsyncInvoker(_Poller):
    """Asynchronous invocations of ``function`` from its local event queue, with Lambda's retries and on-failure
    destination."""

    def __init__(
        self,
        sqs: Any,
        function: LocalFunction,
        *,
        queue_url: str,
        max_retries: int,
        on_failure: Callable[[dict[str, Any]], None] | None,
    ) -> None:
        super().__init__(f"async-{function.logical_id}", sqs, queue_url)
        self.function = function
        self.max_retries = max_retries
        self._on_failure = on_failure
        self._invocations = concurrent.futures.ThreadPoolExecutor(
            function.instances, thread_name_prefix=f"async-{function.logical_id}"
        )

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._invocations.shutdown(wait=False)

    def handle(self, messages: list[dict[str, Any]]) -> None:
        done = [handle for handle in self._invocations.map(self._invoke, messages) if handle is not None]
        self.delete(done)

    def _invoke(self, message: dict[str, Any]) -> str | None:
        """One asynchronous invocation; the message's receipt handle when it is done with (delivered or given up)."""
        event = json.loads(message["Body"])
        if event.get("Event") == "s3:TestEvent":  # S3 sends it when a notification is configured
            return message["ReceiptHandle"]
        if event.get("Type") == "Notification":
            event = _sns_event(event, f"{event.get('TopicArn')}:local")
        result = self.function.invoke(event)
        attempt = int(message["Attributes"].get("ApproximateReceiveCount", "1"))
        if not result.error:
            return message["ReceiptHandle"]
        if attempt <= self.max_retries:
            delay = LOCAL_RETRY_DELAYS_S[min(attempt, len(LOCAL_RETRY_DELAYS_S)) - 1]
            logger.warning(
                "%s failed (attempt %d of %d): %s; retrying in %d s",
                self.function.logical_id,
                attempt,
                self.max_retries + 1,
                result.payload.get("errorMessage"),
                delay,
            )
            self._sqs.change_message_visibility(
                QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=delay
            )
            return None
        self._give_up(event, result, attempt)
        return message["ReceiptHandle"]

    def _give_up(self, event: Any, result: InvokeResult, attempts: int) -> None:
        record = {
            "version": "1.0",
            "timestamp": dt.datetime.now(dt.UTC).isoformat(),
            "requestContext": {
                "requestId": str(uuid.uuid4()),
                "functionArn": f"{self.function.arn}:$LATEST",
                "condition": "RetriesExhausted",
                "approximateInvokeCount": attempts,
            },
            "requestPayload": event,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": result.payload,
        }
        if self._on_failure is None:
            logger.error(
                "%s failed %d times; no on-failure destination, the event is dropped",
                self.function.logical_id,
                attempts,
            )
            return
        logger.error(
            "%s failed %d times; the event goes to its on-failure destination", self.function.logical_id, attempts
        )
        self._on_failure(record)


def event_sources(
    deployment: Deployment,
    functions: dict[str, LocalFunction],
    sqs: Any,
    sns: Any,
    streams: Any | None = None,
) -> list[_Poller | DynamoDbStreamSource]:
    """Every event source of the template's functions, ready to start (``streams``: a ``dynamodbstreams`` client, for
    the mappings on tables' streams)."""
    pollers: list[_Poller | DynamoDbStreamSource] = []
    table_streams = {t.attributes.get("StreamArn") for t in deployment.of_type("AWS::DynamoDB::Table").values()}
    for mapping in deployment.of_type("AWS::Lambda::EventSourceMapping").values():
        props = mapping.properties
        function = functions[deployment.function_by_arn(props["FunctionName"])]
        source_arn = props["EventSourceArn"]
        if source_arn in table_streams - {None}:
            if streams is None:
                raise ValueError(f"event source {source_arn} of {function.logical_id}: no dynamodbstreams client")
            pollers.append(DynamoDbStreamSource(streams, function, stream_arn=source_arn, mapping=props))
            continue
        queue = next(
            (q for q in deployment.of_type("AWS::SQS::Queue").values() if q.attributes["Arn"] == source_arn), None
        )
        if queue is None:
            raise ValueError(
                f"event source {source_arn} of {function.logical_id}: only SQS queues and DynamoDB streams run locally"
            )
        pollers.append(
            SqsEventSource(
                sqs,
                function,
                queue_url=queue.ref,
                queue_arn=source_arn,
                batch_size=int(props.get("BatchSize", 10)),
                report_batch_item_failures="ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
            )
        )
    invoke_configs = {
        deployment.function_by_arn(c.properties["FunctionName"]): c.properties
        for c in deployment.of_type("AWS::Lambda::EventInvokeConfig").values()
    }
    for logical_id, queue_url in deployment.async_event_queues.items():
        config = invoke_configs.get(logical_id, {})
        destination = config.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
        pollers.append(
            AsyncInvoker(
                sqs,
                functions[logical_id],
                queue_url=queue_url,
                max_retries=int(config.get("MaximumRetryAttempts", DEFAULT_ASYNC_RETRIES)),
                on_failure=_destination(deployment, destination, sqs, sns) if destination else None,
            )
        )
    return pollers


def _destination(deployment: Deployment, arn: str, sqs: Any, sns: Any) -> Callable[[dict[str, Any]], None]:
    """Sends an invocation record to an on-failure destination (an SQS queue or an SNS topic)."""
    if ":sqs:" in arn:
        queue = next(q for q in deployment.of_type("AWS::SQS::Queue").values() if q.attributes["Arn"] == arn)
        return lambda record: sqs.send_message(QueueUrl=queue.ref, MessageBody=json.dumps(record))
    if ":sns:" in arn:
        return lambda record: sns.publish(TopicArn=arn, Message=json.dumps(record))
    raise ValueError(f"on-failure destination {arn}: only SQS and SNS destinations run locally")
