"""The model's files from S3: with ``MODEL_S3_URI=s3://bucket/prefix/`` the worker copies that prefix into ``MODEL_DIR``
before the engine starts, and the engine loads from there (no model hub at run time, no image per model).

A file already in ``MODEL_DIR`` with the object's size and the ETag recorded when it was downloaded is kept, so a
restarted task on the same host (``MODEL_DIR`` on the instance's volume) starts without downloading again. The
recorded ETags live in ``MODEL_DIR/.model-source.json``. Each file is downloaded beside its final name and renamed into
place, so a download cut short is never taken for a complete file; files download concurrently, and a large one in
concurrent parts (boto3's transfer manager).

A prefix without the model's ``config.json`` is waited on (``wait_for_weights``), not failed on: the stack's own
model bucket is empty until the weights are uploaded after the first deploy (docs/deploying.md), and a worker that
exited on it would be replaced in a loop, tripping the deployment circuit breaker and rolling the whole stack back.
While it waits the worker stays healthy and says why in its log, listing the prefix again every ``WEIGHTS_POLL_S``.
``config.json`` is the signal that the upload is complete: vLLM needs it in any model directory, and the documented
upload sends it last, so a worker never syncs half an upload.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from boto3.s3.transfer import TransferConfig

logger = logging.getLogger("gpu_worker.model_source")

MANIFEST_NAME = ".model-source.json"
DOWNLOAD_THREADS = 8  # files at once
PART_THREADS = 4  # parts at once within one large file
_TRANSFER = TransferConfig(max_concurrency=PART_THREADS)
READY_FILE = "config.json"
# A prefix without READY_FILE is listed again this often (a LIST request: about $0.04 a day per waiting task at this rate), and the
# reason the worker waits is logged again this often, so that a log read at any time shows it.
WEIGHTS_POLL_S = 10.0
WAITING_LOG_S = 300.0
BEAT_S = 1.0  # how often the waiting worker's health file is touched, and its stop looked for


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix ending in "/", or "" for the whole bucket); ValueError saying what is wrong."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix/ URI")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket")
    return bucket, prefix if not prefix or prefix.endswith("/") else prefix + "/"


@dataclass
class SyncReport:
    downloaded: list[str] = field(default_factory=list)  # paths relative to the model directory
    kept: list[str] = field(default_factory=list)
    bytes_downloaded: int = 0


class ModelSource:
    """The objects under an S3 prefix, mirrored into a local directory."""

    def __init__(self, uri: str, directory: Path, *, s3: Any | None = None) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = uri
        self.directory = directory
        if s3 is None:
            from async_inference.aws import client

            s3 = client("s3")
        self._s3 = s3

    def wait_for_weights(
        self, *, stopping: Callable[[], bool], beat: Callable[[], None], poll_s: float = WEIGHTS_POLL_S
    ) -> bool:
        """Block until the prefix holds ``READY_FILE`` (True) or ``stopping()`` says to stop (False), calling ``beat``
        (the worker's health file) every ``BEAT_S`` meanwhile. Blocking (the worker runs it in a thread)."""
        logged_at: float | None = None
        while READY_FILE not in self._list():
            now = time.monotonic()
            if logged_at is None or now - logged_at >= WAITING_LOG_S:
                logger.warning(
                    "%s holds no %s yet: waiting for the model's files, listing again every %g s (upload them there, "
                    "%s last: docs/deploying.md, 'Before the weights are uploaded'); the worker takes no job until then",
                    self.uri,
                    READY_FILE,
                    poll_s,
                    READY_FILE,
                )
                logged_at = now
            next_look = now + poll_s
            while time.monotonic() < next_look:
                if stopping():
                    return False
                beat()
                time.sleep(min(BEAT_S, max(0.0, next_look - time.monotonic())))
        return True

    def sync(self) -> SyncReport:
        """Download what is missing or changed; the files kept and fetched. Blocking (the worker runs it in a thread).
        ValueError when the prefix holds no files or a key would land outside the directory."""
        started = time.monotonic()
        objects = self._list()
        if not objects:
            raise ValueError(f"{self.uri} holds no objects: set MODEL_S3_URI to the prefix of the model's files")
        self.directory.mkdir(parents=True, exist_ok=True)
        recorded = self._read_manifest()
        report = SyncReport()
        wanted = []
        for relative, (key, size, etag) in objects.items():
            path = self.directory / relative
            if path.is_file() and path.stat().st_size == size and recorded.get(relative) == etag:
                report.kept.append(relative)
            else:
                wanted.append((relative, key, size))
        with concurrent.futures.ThreadPoolExecutor(DOWNLOAD_THREADS, thread_name_prefix="model-download") as pool:
            for relative, size in pool.map(lambda item: self._download(*item), wanted):
                report.downloaded.append(relative)
                report.bytes_downloaded += size
        self._write_manifest({relative: etag for relative, (_, _, etag) in objects.items()})
        logger.info(
            "model files from %s in %s: %d downloaded (%.1f MB), %d kept, in %.1f s",
            self.uri,
            self.directory,
            len(report.downloaded),
            report.bytes_downloaded / 1e6,
            len(report.kept),
            time.monotonic() - started,
        )
        return report

    def _list(self) -> dict[str, tuple[str, int, str]]:
        """relative path -> (key, size, ETag) of every object under the prefix (folder markers left out)."""
        objects = {}
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/"):
                    continue
                relative = PurePosixPath(key[len(self.prefix) :])
                if relative.is_absolute() or ".." in relative.parts:
                    raise ValueError(f"s3://{self.bucket}/{key} would be written outside {self.directory}")
                objects[str(relative)] = (key, int(item["Size"]), item["ETag"])
        return objects

    def _download(self, relative: str, key: str, size: int) -> tuple[str, int]:
        path = self.directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            self._s3.download_file(self.bucket, key, str(partial), Config=_TRANSFER)
            partial.replace(path)
        finally:
            partial.unlink(missing_ok=True)
        return relative, size

    def _read_manifest(self) -> dict[str, str]:
        try:
            recorded = json.loads((self.directory / MANIFEST_NAME).read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return recorded if isinstance(recorded, dict) else {}

    def _write_manifest(self, etags: dict[str, str]) -> None:
        partial = self.directory / f"{MANIFEST_NAME}.{uuid.uuid4().hex[:8]}.partial"
        partial.write_text(json.dumps(etags, indent=1, sort_keys=True))
        partial.replace(self.directory / MANIFEST_NAME)
