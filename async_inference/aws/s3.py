"""The claim-check bucket in S3: ``Blobs`` reads, writes and presigns its request and result objects;
``PayloadTooLarge`` is a read over its size limit."""

from __future__ import annotations

import datetime as dt
from typing import Any

from botocore.exceptions import ClientError

from async_inference import settings
from async_inference.aws.clients import client, is_error


class PayloadTooLarge(Exception):
    pass


class Blobs:
    """Request and result objects in the claim-check bucket."""

    def __init__(self, bucket: str, s3: Any | None = None) -> None:
        self.bucket = bucket
        self._s3 = s3 or client("s3")

    def put_json(self, key: str, body: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")

    def put_json_once(
        self,
        key: str,
        body: bytes,
        *,
        bucket: str | None = None,
        content_type: str = "application/json",
        max_bytes: int = settings.MAX_UPLOAD_BYTES,
    ) -> bytes | None:
        """Write ``body`` unless the key exists (S3 conditional write); the existing object's bytes if it did."""
        try:
            self._s3.put_object(
                Bucket=bucket or self.bucket, Key=key, Body=body, ContentType=content_type, IfNoneMatch="*"
            )
        except ClientError as exc:
            if is_error(exc, "PreconditionFailed", "ConditionalRequestConflict", "412"):
                return self.get(key, max_bytes=max_bytes, bucket=bucket)
            raise
        return None

    def get_range(self, key: str, first_byte: int, last_byte: int, *, bucket: str | None = None) -> bytes:
        """Bytes ``first_byte`` to ``last_byte`` (inclusive, as an HTTP Range) of an object; KeyError when absent."""
        try:
            response = self._s3.get_object(
                Bucket=bucket or self.bucket, Key=key, Range=f"bytes={first_byte}-{last_byte}"
            )
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "NoSuchBucket"):
                raise KeyError(key) from exc
            raise
        return response["Body"].read()

    def get(self, key: str, *, max_bytes: int, bucket: str | None = None) -> bytes:
        """The object's bytes; KeyError when absent, PayloadTooLarge when over ``max_bytes``."""
        try:
            response = self._s3.get_object(Bucket=bucket or self.bucket, Key=key)
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "NoSuchBucket"):
                raise KeyError(key) from exc
            if is_error(exc, "AccessDenied", "403") and not self._listed(bucket or self.bucket, key):
                raise KeyError(key) from exc
            raise
        if response["ContentLength"] > max_bytes:
            response["Body"].close()
            raise PayloadTooLarge(f"{response['ContentLength']} bytes, limit {max_bytes}")
        return response["Body"].read()

    def _listed(self, bucket: str, key: str) -> bool:
        """Whether a listing shows ``key``: settles a GetObject answered 403, which S3 gives for a missing key to a
        caller whose s3:ListBucket does not cover it (the stack grants ListBucket only with an s3:prefix condition,
        which a ListObjectsV2 with ``Prefix=key`` meets). True when the listing is refused too: the 403 stands."""
        try:
            listing = self._s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
        except ClientError:
            return True
        return any(item["Key"] == key for item in listing.get("Contents", []))

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=key)

    def written_at(self, key: str) -> dt.datetime | None:
        """When the object was last written (S3's LastModified, whole seconds); None when it is absent."""
        try:
            return self._s3.head_object(Bucket=self.bucket, Key=key)["LastModified"]
        except ClientError as exc:
            if is_error(exc, "NoSuchKey", "404", "NotFound"):
                return None
            raise

    def presign_put(self, key: str, *, size_bytes: int, expires_s: int) -> tuple[str, dict[str, str]]:
        """A SigV4 presigned PUT. Content-Length and Content-Type are signed, so S3 refuses a body of another size."""
        headers = {"Content-Type": "application/json", "Content-Length": str(size_bytes)}
        url = self._s3.generate_presigned_url(
            "put_object",
            Params={"Bucket": self.bucket, "Key": key, "ContentType": "application/json", "ContentLength": size_bytes},
            ExpiresIn=expires_s,
        )
        return url, headers

    def presign_get(self, key: str, *, expires_s: int) -> str:
        return self._s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_s
        )
