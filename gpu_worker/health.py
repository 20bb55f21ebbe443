"""The worker's liveness, as a file: the worker keeps it fresh, the container health check reads its age.

``python3 -m gpu_worker.health`` (the task definition's health check command) exits 0 when the file that
``WORKER_HEALTH_FILE`` names (default ``/tmp/gpu-worker-health``) was touched within ``HEALTH_MAX_AGE_S`` seconds, and 1
with a one-line reason otherwise. The worker touches it first once its engine has started, then at every heartbeat of
its event loop, so a hung loop goes stale. While it syncs and loads the model nothing touches it: a task is healthy
only with a started engine, so a deployment whose model cannot load (a gated model without its token, a CUDA
mismatch, out of memory) never turns healthy. The one exception: a worker waiting for its S3 prefix to hold the
weights at all touches it while it waits (``gpu_worker.model_source``), since the stack's own bucket is empty at the
first deploy. A start that hangs is ended by the worker itself: past
``WORKER_START_TIMEOUT_S`` (``StartDeadline``, a thread, since vLLM builds its engine with the event loop blocked) the
process exits with ``EXIT_START_TIMEOUT``, and ECS replaces the task and frees its GPU.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from async_inference import config as env
from async_inference.config import EnvSettings, SettingsError

logger = logging.getLogger("gpu_worker.health")


class HealthFile:
    """The file the worker touches; ``path`` None (a worker run inside a test or benchmark) touches nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def touch(self) -> None:
        if self.path is None:
            return
        try:
            self.path.touch()
        except OSError as exc:  # a full or read-only disk: the health check will say so by the file's age
            logger.warning("could not touch the health file %s: %s", self.path, exc)


class StartDeadline:
    """``with StartDeadline(seconds, on_expiry):`` calls ``on_expiry`` from a thread if the block has not ended within
    ``seconds``, however long the event loop stays blocked in it (None: no deadline)."""

    def __init__(self, seconds: float | None, on_expiry: Callable[[], None]) -> None:
        self.seconds = seconds
        self._timer = threading.Timer(seconds, on_expiry) if seconds is not None else None
        if self._timer is not None:
            self._timer.name = "start-deadline"
            self._timer.daemon = True

    def __enter__(self) -> StartDeadline:
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


def stale_reason(path: Path, max_age_s: float, *, now: float | None = None) -> str | None:
    """Why the worker whose health file is ``path`` is unhealthy, or None when it was touched recently enough."""
    try:
        touched = path.stat().st_mtime
    except FileNotFoundError:
        return f"{path} does not exist: the worker has not started its loops"
    except OSError as exc:
        return f"{path} cannot be read: {exc}"
    age = (time.time() if now is None else now) - touched
    if age > max_age_s:
        return f"{path} was last touched {age:.0f} s ago (limit {max_age_s:g} s): the worker's loop is stuck"
    return None


class HealthSettings(EnvSettings):
    """The health check's settings: the worker's own two, read from the same container environment."""

    health_file: Path = Field(
        Path(env.DEFAULT_HEALTH_FILE), alias=env.ENV_HEALTH_FILE, description="the file the worker keeps fresh"
    )
    health_max_age_s: float = Field(
        env.DEFAULT_HEALTH_MAX_AGE_S,
        gt=0,
        alias=env.ENV_HEALTH_MAX_AGE_S,
        description="seconds after which a stale health file fails the health check",
    )


def main() -> int:
    try:
        config = HealthSettings.load()
    except SettingsError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    reason = stale_reason(config.health_file, config.health_max_age_s)
    if reason is not None:
        print(f"unhealthy: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
