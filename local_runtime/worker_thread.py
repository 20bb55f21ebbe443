"""A worker on its own thread and event loop inside this process: for benchmarks and tests that need to look inside
it (its engine, its counters, the requests it makes)."""

from __future__ import annotations

import asyncio
import threading

from gpu_worker.engines.base import Engine
from gpu_worker.worker import Worker, WorkerConfig


class WorkerThread:
    """``with WorkerThread(worker) as w:`` runs ``w`` until the block ends, then stops it and waits for its drain."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(worker.run(),), daemon=True)

    @classmethod
    def for_engine(cls, engine: Engine, config: WorkerConfig) -> WorkerThread:
        return cls(Worker(config, engine))

    def __enter__(self) -> Worker:
        self._thread.start()
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self.worker.stop)
        self._thread.join(timeout=120)
