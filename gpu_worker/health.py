"""The worker's liveness, as a file: the worker keeps it fresh, the container health check reads its age.

``python3 -m gpu_worker.health`` (the task definition's health check command) exits 0 when the file that
``WORKER_HEALTH_FILE`` names (default ``/tmp/gpu-worker-health``) was touched within ``HEALTH_MAX_AGE_S`` seconds, and 1
with a one-line reason otherwise. The worker touches it at every heartbeat of its event loop, so a hung loop goes
stale; while it syncs and loads the model (minutes, with the loop blocked by vLLM's engine build) a thread keeps it
fresh instead (``HealthFile.kept_fresh``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

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

    @contextlib.contextmanager
    def kept_fresh(self, interval_s: float) -> Iterator[None]:
        """Touch the file every ``interval_s`` from a thread for the duration of the block, however long the event
        loop stays blocked in it."""
        self.touch()
        done = threading.Event()

        def keep() -> None:
            while not done.wait(interval_s):
                self.touch()

        thread = threading.Thread(target=keep, name="health-while-starting", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.touch()


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
        env.DEFAULT_HEALTH_MAX_AGE_S, gt=0, alias=env.ENV_HEALTH_MAX_AGE_S,
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
