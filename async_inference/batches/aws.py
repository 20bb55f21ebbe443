"""Small adapters over the S3, SQS and SNS calls the Files and Batches APIs make (the table's is ``store.py``).

Each takes its boto3 client in the constructor (one set per process; tests hand in clients of a moto server).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote

from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.aws import client, is_error
from async_inference.batches.models import BatchNotification
from async_inference.schemas import BatchControl, ChunkClaimCheck

JSONL = "application/jsonl"
SQS_BATCH_ENTRIES = 10
READ_CHUNK_BYTES = 1024 * 1024


class FileObjects:
    """Files' bytes in the claim-check bucket, under ``settings.FILE_PREFIX`` (and chunk parts under BATCH_PREFIX)."""

    def __init__(self, bucket: str, s3: Any | None = None) -> None:
        self.bucket = bucket
        self._s3 = s3 or client("s3")

    def put(self, key: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=JSONL)

    def copy(self, source: str, target: str) -> None:
        """A server-side copy of an object (CopyObject: up to 5 GB, far above a batch file); KeyError when the source
        is gone."""
        try:
            self._s3.copy_object(
                Bucket=self.bucket,
                Key=target,
                CopySource={"Bucket": self.bucket, "Key": source},
                ContentType=JSONL,
                MetadataDirective="REPLACE",
            )
        except ClientError as exc:
            if is_error(exc, "404", "NoSuchKey", "NotFound"):
                raise KeyError(source) from exc
            raise

    def size(self, key: str) -> int | None:
        """The object's size, or None when there is no such object."""
        try:
            return int(self._s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if is_error(exc, "404", "NoSuchKey", "NotFound", "403", "AccessDenied"):
                # A HEAD of a missing key is 403 to a caller that may not list it: the grants list only what they read.
                return None
            raise

    def stream(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks; KeyError when there is none."""
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "403", "AccessDenied"):
                raise KeyError(key) from exc
            raise
        try:
            yield from body.iter_chunks(READ_CHUNK_BYTES)
        finally:
            body.close()

    def read(self, key: str) -> bytes | None:
        """A (small) object's bytes, or None when there is none."""
        try:
            return b"".join(self.stream(key))
        except KeyError:
            return None

    def write_stream(self, key: str, chunks: Iterable[bytes]) -> None:
        """Write the concatenation of ``chunks`` as one object, in a multipart upload when it is large (boto3's
        managed transfer), never holding more than a few parts in memory."""
        self._s3.upload_fileobj(_ChunkReader(iter(chunks)), self.bucket, key, ExtraArgs={"ContentType": JSONL})

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=key)

    def presign_get(self, key: str, *, expires_s: int, filename: str) -> str:
        return self._s3.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ResponseContentDisposition": content_disposition(filename),
            },
            ExpiresIn=expires_s,
        )

    def presign_put(self, key: str, *, size_bytes: int, expires_s: int) -> tuple[str, dict[str, str]]:
        """A SigV4 presigned PUT with Content-Length and Content-Type signed: S3 refuses a body of another size."""
        headers = {"Content-Type": JSONL, "Content-Length": str(size_bytes)}
        url = self._s3.generate_presigned_url(
            "put_object",
            Params={"Bucket": self.bucket, "Key": key, "ContentType": JSONL, "ContentLength": size_bytes},
            ExpiresIn=expires_s,
        )
        return url, headers


def content_disposition(filename: str) -> str:
    """``attachment`` with the file's name as RFC 6266 says: ``filename*`` percent-encoded in UTF-8 (RFC 5987), the
    name itself, and ``filename`` a quoted ASCII fallback with quotes, backslashes, control and non-ASCII characters
    replaced, so no name can end the quoted string and add a parameter of its own (``a"; filename="evil.html``).
    The fallback keeps letters, digits, ``.``, ``-``, ``_`` and spaces only: a parser that splits on ``;`` before it
    reads quotes finds no second parameter either."""
    fallback = "".join(c if c.isascii() and (c.isalnum() or c in "._- ") else "_" for c in filename) or "file"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte strings (what ``upload_fileobj`` reads from)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


class _Queue:
    def __init__(self, queue_url: str, sqs: Any | None = None) -> None:
        self.url = queue_url
        self._sqs = sqs or client("sqs")

    def _send_all(self, bodies: list[str], *, group: str | None = None) -> None:
        """SendMessageBatch, 10 a request; raises when any entry fails (the caller's message is then redelivered and
        sends them all again: duplicates are harmless to its consumers). ``group``: their MessageGroupId."""
        extra = {} if group is None else {"MessageGroupId": group}
        for start in range(0, len(bodies), SQS_BATCH_ENTRIES):
            entries = [
                {"Id": str(i), "MessageBody": body, **extra}
                for i, body in enumerate(bodies[start : start + SQS_BATCH_ENTRIES])
            ]
            failed = self._sqs.send_message_batch(QueueUrl=self.url, Entries=entries).get("Failed", [])
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(entries)} messages not sent to {self.url}: {failed[0]}")


class ControlQueue(_Queue):
    """The batch control queue: plan and finalize steps for the controller."""

    def send(self, control: BatchControl) -> None:
        self._sqs.send_message(QueueUrl=self.url, MessageBody=control.model_dump_json())


class ChunkQueue(_Queue):
    """The batch-lane queue: one chunk claim check per ``settings.BATCH_CHUNK_LINES`` lines."""

    def send_all(self, claims: list[ChunkClaimCheck]) -> None:
        """One batch's chunks, with its tenant as message group (what SQS fair queues tell tenants apart by)."""
        tenants = {claim.tenant for claim in claims}
        self._send_all(
            [claim.model_dump_json(exclude_none=True) for claim in claims],
            group=tenants.pop() if len(tenants) == 1 else None,
        )


class BatchNotifier:
    """Publishes a batch's end to the result topic, with the attributes subscriptions filter on. ``webhook`` is
    "true" only for a batch whose webhook asked for this event: the webhook dispatcher's subscription takes those."""

    def __init__(self, topic_arn: str, sns: Any | None = None) -> None:
        self.topic_arn = topic_arn
        self._sns = sns or client("sns")

    def publish(self, notification: BatchNotification, *, has_webhook: bool = False) -> None:
        attributes = {
            "status": {"DataType": "String", "StringValue": notification.batch.status.value},
            settings.TENANT_ATTRIBUTE: {"DataType": "String", "StringValue": notification.tenant},
            "event": {"DataType": "String", "StringValue": notification.type},
            settings.WEBHOOK_ATTRIBUTE: {"DataType": "String", "StringValue": "true" if has_webhook else "false"},
        }
        if notification.batch.model:
            attributes["model"] = {"DataType": "String", "StringValue": notification.batch.model}
        self._sns.publish(
            TopicArn=self.topic_arn,
            Message=notification.model_dump_json(exclude_none=True),
            MessageAttributes=attributes,
        )
