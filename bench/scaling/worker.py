"""The worker (gpu_worker/worker.py) as the queue and the engine see it.

It holds up to the engine's capacity plus a prefetch of ``max(10, capacity // 2)`` messages, receiving in batches of
up to 10 whenever it has room and messages are visible (SQS long polling returns as soon as one is). A job whose queue
deadline passed when received is marked expired and deleted without running. On stop (SIGTERM) it receives no more,
lets what it holds finish for ``drain_timeout_s``, then releases the rest (visible again at once). ECS task
protection follows the worker's TASK_PROTECTION mode (gpu_worker/task_protection.py): ``busy`` while it holds any
message, ``long_jobs`` while it holds a job whose tokens at the expected decode rate would outlast the drain (the
trace gives no max_tokens, so a job's generated tokens stand for it), ``off`` never.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy

from bench.scaling.engine import Engine, EngineModel
from bench.scaling.figures import DRAIN_TIMEOUT_S, RECEIVE_BATCH, RECEIVE_WAIT_S, RECEIVERS_MAX
from bench.scaling.queue import Job, Queue


def held_messages(capacity: int) -> int:
    """WorkerConfig.held_messages with the default prefetch."""
    return capacity + max(RECEIVE_BATCH, capacity // 2)


class Worker:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        queue: Queue,
        engine_model: EngineModel,
        on_change: Callable[[], None],
        on_stopped: Callable[[Worker], None],
        record_start: Callable[[Job, float], None],
        record_done: Callable[[Job, float], None],
        *,
        protection: str = "busy",
        long_job_tokens: float = math.inf,
    ) -> None:
        """``protection``: busy, long_jobs or off; ``long_job_tokens``: tokens beyond which a job is long."""
        self.env = env
        self.protection = protection
        self.long_job_tokens = long_job_tokens
        self.name = name
        self.queue = queue
        self.budget = held_messages(engine_model.max_num_seqs)
        self.receivers = max(1, min(RECEIVERS_MAX, math.ceil(engine_model.max_num_seqs / RECEIVE_BATCH)))
        self.held = 0
        self.held_jobs: dict[int, Job] = {}
        self.stopping = False
        self.stopped = False
        self.receives = 0.0
        self._idle_since: float | None = env.now
        self._on_change = on_change
        self._on_stopped = on_stopped
        self._record_start = record_start
        self._record_done = record_done
        self.engine = Engine(env, engine_model, self._started, self._done)

    @property
    def free(self) -> int:
        return 0 if self.stopping else self.budget - self.held

    @property
    def protected(self) -> bool:
        if self.protection == "busy":
            return self.held > 0
        if self.protection == "long_jobs":
            return any(job.generated_tokens > self.long_job_tokens for job in self.held_jobs.values())
        return False

    def take(self, jobs: list[Job]) -> None:
        """Messages this worker received."""
        now = self.env.now
        self._account_idle(now)
        self.receives += 1
        for job in jobs:
            if now > job.deadline_s:
                job.expired = True
                job.finished_s = now
                self.queue.delete()
                continue
            self.held += 1
            self.held_jobs[job.index] = job
            self.engine.submit(job)

    def waiting_for_messages(self) -> None:
        """The queue had nothing for this worker's free room: its receivers long-poll (counted for request costs)."""
        if self._idle_since is None and self.free > 0:
            self._idle_since = self.env.now

    def _account_idle(self, now: float) -> None:
        if self._idle_since is not None:
            self.receives += self.receivers * (now - self._idle_since) / RECEIVE_WAIT_S
            self._idle_since = None

    def _started(self, job: Job) -> None:
        self._record_start(job, self.env.now)

    def _done(self, job: Job) -> None:
        self.held -= 1
        self.held_jobs.pop(job.index, None)
        self.queue.delete()
        self._record_done(job, self.env.now)
        if self.stopping and self.held == 0:
            self._finish()
        else:
            self._on_change()

    def stop(self) -> None:
        """SIGTERM: stop receiving, drain, then release what is left."""
        if self.stopping:
            return
        self.stopping = True
        self._account_idle(self.env.now)
        if self.held == 0:
            self._finish()
            return
        self.env.process(self._drain())

    def _drain(self):
        yield self.env.timeout(DRAIN_TIMEOUT_S)
        if not self.stopped:
            leftovers = list(self.held_jobs.values())
            for job in leftovers:
                job.started_s = None
                job.first_token_s = None
            self.queue.release(leftovers, self.env.now)
            self.held = 0
            self.held_jobs.clear()
            self._finish()

    def _finish(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.engine.stop()
        self._on_stopped(self)

    def close_accounting(self) -> None:
        self._account_idle(self.env.now)
