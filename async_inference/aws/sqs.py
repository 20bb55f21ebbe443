"""The service's SQS queues: the claim-check queue (``JobQueue``, and the ``QueueMessage`` it receives), the batch
control queue (``ControlQueue``), the upload-deadline queue (``UploadDeadlines``) and the webhook queue
(``WebhookQueues``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from async_inference import settings
from async_inference.aws.clients import client
from async_inference.schemas import BatchControl, ClaimCheck, UploadDeadline


@dataclass(frozen=True)
class QueueMessage:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    queue_url: str | None = None  # the queue it was received from (receipt handles are valid there only)


SQS_MAX_DELAY_S = 900  # SQS's longest DelaySeconds


class JobQueue:
    """The claim-check queue."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def send(self, claim: ClaimCheck) -> None:
        # The tenant as message group: on a standard queue it is what SQS fair queues tell tenants apart by (a tenant
        # with a backlog is served after quiet ones); without fair queues (moto) it changes nothing.
        self._sqs.send_message(
            QueueUrl=self.url, MessageBody=claim.model_dump_json(exclude_none=True), MessageGroupId=claim.tenant
        )

    def requeue(self, messages: list[tuple[QueueMessage, str]], *, delay_s: int = 0) -> list[str]:
        """Send each (message, tenant) received from this queue again at the tail, as a new message (its receive
        count starts over) hidden for ``delay_s`` (at most SQS's 900), and delete the received one; the receipt
        handles not requeued (a failed send: that message returns after its visibility timeout; a failed delete:
        both copies stay, and the job's lease lets only one run). Up to 10 per request."""
        failed: list[str] = []
        for start in range(0, len(messages), settings.RECEIVE_BATCH_SIZE):
            chunk = messages[start : start + settings.RECEIVE_BATCH_SIZE]
            entries = [
                {"Id": str(i), "MessageBody": m.body, "MessageGroupId": tenant}
                | ({"DelaySeconds": min(delay_s, SQS_MAX_DELAY_S)} if delay_s > 0 else {})
                for i, (m, tenant) in enumerate(chunk)
            ]
            response = self._sqs.send_message_batch(QueueUrl=self.url, Entries=entries)
            unsent = {int(f["Id"]) for f in response.get("Failed", [])}
            failed.extend(chunk[i][0].receipt_handle for i in sorted(unsent))
            sent = [m.receipt_handle for i, (m, _) in enumerate(chunk) if i not in unsent]
            if sent:
                failed.extend(self.delete_batch(sent))
        return failed

    def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int | None = None) -> list[QueueMessage]:
        """Up to ``max_messages`` messages, hidden for ``visibility_timeout_s`` (the queue's default when None)."""
        extra = {} if visibility_timeout_s is None else {"VisibilityTimeout": visibility_timeout_s}
        response = self._sqs.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=max(1, min(max_messages, settings.RECEIVE_BATCH_SIZE)),
            WaitTimeSeconds=wait_s,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
            **extra,
        )
        return [
            QueueMessage(
                message_id=m["MessageId"],
                receipt_handle=m["ReceiptHandle"],
                body=m["Body"],
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                queue_url=self.url,
            )
            for m in response.get("Messages", [])
        ]

    def delete_batch(self, receipt_handles: list[str]) -> list[str]:
        """Delete up to 10 messages in one request; the handles that failed."""
        return self._batch("delete_message_batch", [{"ReceiptHandle": h} for h in receipt_handles])

    def change_visibility_batch(self, receipt_handles: list[str], timeout_s: int) -> list[str]:
        """Set the visibility timeout of up to 10 messages in one request; the handles that failed."""
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": timeout_s} for h in receipt_handles]
        return self._batch("change_message_visibility_batch", entries)

    def _batch(self, operation: str, entries: list[dict[str, Any]]) -> list[str]:
        failed: list[str] = []
        for start in range(0, len(entries), settings.RECEIVE_BATCH_SIZE):
            chunk = [dict(e, Id=str(i)) for i, e in enumerate(entries[start : start + settings.RECEIVE_BATCH_SIZE])]
            response = getattr(self._sqs, operation)(QueueUrl=self.url, Entries=chunk)
            failed.extend(chunk[int(f["Id"])]["ReceiptHandle"] for f in response.get("Failed", []))
        return failed


class ControlQueue:
    """The batch control queue: steps of a batch for the batch controller (``BatchControl``: plan, finalize)."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def send(self, control: BatchControl) -> None:
        self._sqs.send_message(QueueUrl=self.url, MessageBody=control.model_dump_json())


class UploadDeadlines:
    """The upload-deadline queue: one message per upload job, delayed to the end of its presign window."""

    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def schedule(self, job_id: str, delay_s: int) -> None:
        """Deliver the job's deadline after ``delay_s`` (clipped to SQS's 0..900 s; the handler hides a message that
        arrives before the window and its grace are over)."""
        body = UploadDeadline(job_id=job_id).model_dump_json()
        self._sqs.send_message(QueueUrl=self.url, MessageBody=body, DelaySeconds=max(0, min(delay_s, SQS_MAX_DELAY_S)))

    def hide(self, receipt_handle: str, seconds: int) -> None:
        """Deliver a received deadline again after ``seconds``."""
        self._sqs.change_message_visibility(QueueUrl=self.url, ReceiptHandle=receipt_handle, VisibilityTimeout=seconds)


class WebhookQueues:
    """The webhook dispatcher's queues, one per tenant (cdk/webhook_dispatch.py): the result topic feeds each its
    tenant's events; the worker sends "started" events to them directly."""

    def __init__(self, queue_urls: Mapping[str, str], sqs: Any | None = None) -> None:
        """``queue_urls``: tenant -> the URL of its webhook queue."""
        self.urls = dict(queue_urls)
        # A queue's URL ends with its name, as its ARN does: how a received record's queue is found.
        self._by_name = {url.rstrip("/").rsplit("/", 1)[-1]: url for url in self.urls.values()}
        self._sqs = sqs or client("sqs")

    def send(self, tenant: str, body: str) -> None:
        """Queue ``body`` for ``tenant``'s receivers (KeyError: a tenant the stack has no webhook queue for)."""
        self._sqs.send_message(QueueUrl=self.urls[tenant], MessageBody=body)

    def hide(self, queue_arn: str, receipt_handle: str, seconds: int) -> None:
        """Make a message received from the queue ``queue_arn`` visible again only after ``seconds`` (the retry
        backoff)."""
        self._sqs.change_message_visibility(
            QueueUrl=self._by_name[queue_arn.rsplit(":", 1)[-1]],
            ReceiptHandle=receipt_handle,
            VisibilityTimeout=seconds,
        )
