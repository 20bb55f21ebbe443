"""The boto3 clients of the service: the retry and connection-pool settings every client and resource shares
(``BOTO_CONFIG``), ``client`` to make one, and ``is_error`` to tell a service's error codes apart."""

from __future__ import annotations

import os
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

# Retries with backoff for throttling live in botocore ("standard" mode); anything still failing is an infrastructure
# fault that the caller lets surface (the worker leaves the message for redelivery).
# A client's connection pool is as large as the most requests a process makes at once (the worker's I/O threads, which
# it caps at this); a smaller pool discards and reopens connections under load.
MAX_CONCURRENT_REQUESTS = 128
BOTO_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=MAX_CONCURRENT_REQUESTS)


def _s3_config() -> Config:
    # A local endpoint (moto) cannot serve virtual-hosted buckets (bucket.127.0.0.1), so presigned URLs and calls use
    # path-style addressing there; against AWS the default (virtual-hosted) is kept.
    if os.environ.get("AWS_ENDPOINT_URL"):
        return BOTO_CONFIG.merge(Config(s3={"addressing_style": "path"}, signature_version="s3v4"))
    return BOTO_CONFIG.merge(Config(signature_version="s3v4"))


def client(service: str) -> Any:
    """A boto3 client with the project's retry settings."""
    return boto3.client(service, config=_s3_config() if service == "s3" else BOTO_CONFIG)


def is_error(exc: BaseException, *codes: str) -> bool:
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in codes
