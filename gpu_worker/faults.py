"""Fault injection for the fault-tolerance tests, off unless ``WORKER_FAULTS`` is set.

The worker consults ``Faults.at(point, job_id)`` at four named points of a job's life, and ``Faults.install`` wraps
the S3, DynamoDB and engine calls it makes, so the tests can kill a worker or make a dependency fail at a precise
moment without any test-only branch in the worker itself. With ``WORKER_FAULTS`` unset (``Faults.parse("")``), ``at``
does nothing and ``install`` wraps nothing.

``WORKER_FAULTS`` is a comma-separated list of ``name=value``:

======================== ==========================================================================================
``crash=<point>``        SIGKILL this process the first time any job reaches ``<point>``: ``before_engine``,
                         ``after_result_write``, ``after_state_write`` (state final, notification not yet sent) or
                         ``before_delete`` (all done but the SQS delete); or any batch chunk (gpu_worker.chunks):
                         ``in_chunk`` (its first line generated, the others running), ``after_chunk_results`` (its
                         results object written, no part yet), ``between_parts`` (output part written, error part
                         not), ``after_chunk_recorded`` (counted, finalize not sent); ``before_delete`` too
``s3_get_fails=<n>``     the first ``n`` payload reads of each job raise S3 ``SlowDown`` (``always``: every read)
``ddb_write_fails=<n>``  the first ``n`` state transitions of each job raise ``ProvisionedThroughputExceeded``
``engine_oom=<n>``       the first ``n`` generations of each job raise ``TransientEngineError`` (CUDA out of memory)
``slow_start=<s>``       the engine's start blocks the event loop for ``s`` seconds first, as vLLM's engine build does
``engine_dead=<path>``   the engine dies at the first generation, as vLLM's does on a CUDA fault: that generation and
                         every later one in this process raise ``FatalEngineError``. Only while ``<path>`` does not
                         exist: the dying process creates it, so a worker started after it (ECS replacing the task)
                         with the same setting runs normally
======================== ==========================================================================================

The adapter faults are raised where botocore's own retries have already been spent (they replace the call), so they
stand for a throttle that outlasted them: the worker must leave the message for redelivery.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from gpu_worker.engines.base import FatalEngineError, TransientEngineError

POINTS = (
    "before_engine",
    "after_result_write",
    "after_state_write",
    "before_delete",
    "in_chunk",
    "after_chunk_results",
    "between_parts",
    "after_chunk_recorded",
)
ALWAYS = sys.maxsize
logger = logging.getLogger("gpu_worker.faults")


@dataclass
class Faults:
    crash_at: str | None = None
    s3_get_fails: int = 0
    ddb_write_fails: int = 0
    engine_oom: int = 0
    engine_dead: Path | None = None
    slow_start: float = 0.0
    _seen: Counter[tuple[str, str]] = field(default_factory=Counter, repr=False)

    @classmethod
    def parse(cls, spec: str) -> Faults:
        """The faults a ``WORKER_FAULTS`` value names; ValueError saying which item is wrong."""
        faults = cls()
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, value = item.partition("=")
            if name == "crash":
                if value not in POINTS:
                    raise ValueError(f"crash point {value!r} is not one of {', '.join(POINTS)}")
                faults.crash_at = value
            elif name == "slow_start":
                try:
                    faults.slow_start = float(value)
                except ValueError:
                    raise ValueError(f"slow_start={value!r}: give seconds") from None
            elif name == "engine_dead":
                if not value:
                    raise ValueError("engine_dead needs the path of its marker file: engine_dead=<path>")
                faults.engine_dead = Path(value)
            elif name in ("s3_get_fails", "ddb_write_fails", "engine_oom"):
                if value != "always" and not value.isdigit():
                    raise ValueError(f"{name}={value!r}: give a count or 'always'")
                setattr(faults, name, ALWAYS if value == "always" else int(value))
            else:
                raise ValueError(f"unknown fault {name!r}")
        return faults

    @property
    def enabled(self) -> bool:
        return bool(
            self.crash_at
            or self.s3_get_fails
            or self.ddb_write_fails
            or self.engine_oom
            or self.engine_dead
            or self.slow_start
        )

    def at(self, point: str, job_id: str) -> None:
        """Called by the worker at each named point of a job (or chunk, ``batch_id/chunk``); dies here if told to."""
        if point == self.crash_at:
            # Flushed first so the test log shows where the process died; SIGKILL itself leaves no trace.
            logger.error("fault injection: SIGKILL at %s of %s", point, job_id)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self, *, blobs: Any, store: Any, engine: Any) -> None:
        """Wrap the adapters' calls that the configured faults target (instance attributes; classes untouched)."""
        if not self.enabled:
            return
        logger.warning("fault injection enabled: %s", self)
        if self.s3_get_fails:
            blobs.get = self._failing(blobs.get, "s3_get", self.s3_get_fails, _throttle("SlowDown", "GetObject"))
        if self.ddb_write_fails:
            error = _throttle("ProvisionedThroughputExceededException", "UpdateItem")
            store.transition = self._failing(store.transition, "ddb_write", self.ddb_write_fails, error)
        if self.engine_oom:
            error = lambda: TransientEngineError("CUDA out of memory (injected)")  # noqa: E731
            engine.generate = self._failing(engine.generate, "engine", self.engine_oom, error, is_async=True)
        if self.engine_dead:
            engine.generate = self._dying(engine.generate, self.engine_dead)
        if self.slow_start:
            engine.start = self._slow(engine.start, self.slow_start)

    @staticmethod
    def _slow(start: Callable[..., Any], seconds: float) -> Callable[..., Any]:
        async def slow_start() -> Any:
            logger.warning("fault injection: the engine start blocks the event loop for %g s", seconds)
            time.sleep(seconds)  # blocking on purpose: vLLM builds its engine in the event loop's thread
            return await start()

        return slow_start

    def _dying(self, generate: Callable[..., Any], marker: Path) -> Callable[..., Any]:
        """``generate``, unless ``marker`` is missing at the first call: then this one and every later call die."""
        dead = False

        async def dying(*args: Any, **kwargs: Any) -> Any:
            nonlocal dead
            if not dead and not marker.exists():
                marker.touch()
                dead = True
                logger.error("fault injection: the engine dies at the generation of %s", args[0] if args else "?")
            if dead:
                raise FatalEngineError("EngineCore encountered an issue (injected)")
            return await generate(*args, **kwargs)

        return dying

    def _failing(
        self, call: Callable[..., Any], name: str, times: int, error: Callable[[], Exception], *, is_async: bool = False
    ) -> Callable[..., Any]:
        """``call``, except that its first ``times`` calls per first argument (a job id or key) raise ``error()``."""

        def should_fail(args: tuple[Any, ...]) -> bool:
            key = (name, str(args[0]) if args else "")
            self._seen[key] += 1
            if self._seen[key] <= times:
                logger.warning(
                    "fault injection: %s fails (%d of %s) for %s",
                    name,
                    self._seen[key],
                    "always" if times == ALWAYS else times,
                    key[1],
                )
                return True
            return False

        if is_async:

            async def failing_async(*args: Any, **kwargs: Any) -> Any:
                if should_fail(args):
                    raise error()
                return await call(*args, **kwargs)

            return failing_async

        def failing(*args: Any, **kwargs: Any) -> Any:
            if should_fail(args):
                raise error()
            return call(*args, **kwargs)

        return failing


def _throttle(code: str, operation: str) -> Callable[[], Exception]:
    return lambda: ClientError({"Error": {"Code": code, "Message": "injected by WORKER_FAULTS"}}, operation)
