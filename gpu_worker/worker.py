"""The GPU worker's pump: keeps the engine full of claims from the queues, and is the only part that talks to them.

The pump receives per lane (the job queue; the batch-lane queue when it has one) and parses each body once into its
claim (``gpu_worker.claims``): its receiving side, the lanes and their receive loops, is ``gpu_worker.receiving``. It
hands each claim to the runner (``gpu_worker.runner``) and does what the runner's ``Outcome`` says: delete (batched),
make visible again after a backoff, leave, or hand back. While claims run it extends their messages' visibility in
batches (the heartbeat), and on a stop it drains them and hands back what is left.

Up to ``engine.capacity`` requests are in the engine at once (``gpu_worker.lanes.Admission``), and a few more messages
are held beyond that (prefetch) so that reading payloads and writing results overlap generation instead of leaving
engine slots idle: messages are received in batches of 10, and each claim finishes on its own. One tenant holds at
most its share of the interactive lane's messages, counted in engine rows; one received beyond it goes back to the tail of the queue
(``gpu_worker.fairness``), so that another tenant's job is held, and started at the next free slot, however long a
backlog the first has queued.

What each fault leads to (docs/guarantees.md has the client's view):

* crash (SIGKILL, lost host): nothing is acknowledged before its effects are stored, so the held messages come back
  after the visibility timeout and another worker finishes them. Messages are received with this worker's
  ``visibility_timeout_s`` (``VisibilityTimeout`` on the receive, not the queue's default), so that window is the
  worker's setting from the first moment it holds a message. State moves are conditional and the result object is
  written once (``put_json_once``), so a job that runs twice still has one result and one final state; the
  ``notified`` flag lets a redelivery send a notification that a crash kept back.
* SIGTERM (scale-in, deployment): stop receiving, let running claims finish for ``drain_timeout_s``, then abort the
  rest and make their messages visible at once. ECS task scale-in protection is held as ``task_protection`` says
  (``gpu_worker.task_protection``).
* a dead engine (``FatalEngineError``: vLLM's EngineDeadError, a CUDA fault): nothing more can run in this process,
  and retrying here would burn every queued job's receives into the DLQ. The worker stops receiving, cancels what is
  in the engine, lets jobs past it store their results (``drain_timeout_s``), makes every message it still holds
  visible at once (their jobs keep the one receive and attempt they had), and ``run`` returns with ``engine_dead``
  set: ``python -m gpu_worker`` exits with ``EXIT_ENGINE_DEAD`` so that ECS replaces the task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

from async_inference import settings
from async_inference.aws import (
    MAX_CONCURRENT_REQUESTS,
    ConnectionStore,
    ControlQueue,
    JobEvents,
    JobQueue,
    QueueMessage,
    WebhookQueues,
)
from async_inference.jobs_service import JobService
from async_inference.streaming.log import EventLog
from gpu_worker.announce import Announcer
from gpu_worker.chunks import BatchLedger, Chunks
from gpu_worker.claims import Action, InFlight, Outcome
from gpu_worker.config import ENV_START_TIMEOUT_S, WorkerConfig
from gpu_worker.deltas import DeltaWriter
from gpu_worker.deployments import DeploymentWatch
from gpu_worker.engines.base import Engine, FatalEngineError
from gpu_worker.fairness import TenantShare
from gpu_worker.faults import Faults
from gpu_worker.health import HealthFile, StartDeadline
from gpu_worker.lanes import INTERACTIVE, Admission
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.model_source import ModelSource
from gpu_worker.progress import ProgressReporter
from gpu_worker.receiving import Lane, Receiver, open_lanes
from gpu_worker.runner import Runner
from gpu_worker.task_protection import Policy, TaskProtection

__all__ = ["EXIT_ENGINE_DEAD", "EXIT_START_TIMEOUT", "Worker", "WorkerConfig"]
logger = logging.getLogger("gpu_worker")
T = TypeVar("T")
# The exit status of a worker whose engine died (``python -m gpu_worker``): its messages were handed back, and its
# supervisor must start a fresh process. 2 is taken by bad settings (gpu_worker.__main__).
EXIT_ENGINE_DEAD = 3
# The exit status of a worker whose model sync and engine start outlasted ``start_timeout_s`` (gpu_worker.health).
EXIT_START_TIMEOUT = 4


class Worker:
    """Receives, holds and settles messages; the ``Runner`` decides what each one's claim comes to."""

    def __init__(
        self,
        config: WorkerConfig,
        engine: Engine,
        *,
        service: JobService | None = None,
        protection: TaskProtection | None = None,
        faults: Faults | None = None,
        metrics: WorkerMetrics | None = None,
        model_source: ModelSource | None = None,
        batches: BatchLedger | None = None,
        deployments: DeploymentWatch | None = None,
    ) -> None:
        """``model_source``: the model's files to sync before the engine starts (``MODEL_S3_URI``); ``batches``: the
        batch table's ``BatchStore``, which the batch lane needs (``config.batch_queue_url``); ``deployments``: tells
        whether a newer deployment waits for this task (None: never)."""
        if config.batch_queue_url is not None and batches is None:
            raise ValueError("batch_queue_url is set but no BatchStore was given: the batch lane counts chunks in it")
        self.config = config
        self.engine = engine
        self.service = service or JobService.from_config(config.service)
        if self.service.queue is None:
            raise ValueError("the worker's JobService has no job queue: a worker receives from its fleet's queue")
        jobs = self.service.queue
        self.health = HealthFile(config.health_file)
        self.metrics = metrics or WorkerMetrics(enabled=False)
        self.model_source = model_source
        self.faults = faults or Faults()
        self.faults.install(blobs=self.service.blobs, store=self.service.store, engine=self.engine)
        self._inflight: dict[str, InFlight] = {}  # by message id
        self._stopping = asyncio.Event()
        self._handback: dict[str, InFlight] = {}  # held messages to make visible at once at the end, by message id
        self.beats = 0  # heartbeats since start
        # boto3 is blocking: its calls run in a pool sized for one request per in-flight job plus the loops (and as
        # many again for the batch lane's messages).
        held = config.held_messages(engine.capacity) * (2 if config.batch_queue_url else 1) + config.fair_room(
            engine.capacity
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(MAX_CONCURRENT_REQUESTS, held + 8), thread_name_prefix="io"
        )
        # Jobs and batch lines inside the engine, interactive first (gpu_worker.lanes).
        self.admission = Admission(engine.capacity, reserve=config.reserve(engine.capacity), abort=engine.abort)
        self.policy = Policy(
            protection or TaskProtection(None),
            mode=config.task_protection,
            tokens_per_s=config.task_protection_tokens_per_s,
            drain_timeout_s=config.drain_timeout_s,
            renew_s=config.task_protection_renew_s,
            held=lambda: self._inflight.values(),
            deployments=deployments,
        )
        events = JobEvents(config.events_topic_arn) if config.events_topic_arn else None
        followers = ConnectionStore(config.connections_table_name) if config.connections_table_name else None
        self.progress = ProgressReporter(
            engine, self.service.store, events, interval_s=config.progress_interval_s, io=self._io, followers=followers
        )
        log = EventLog(config.stream_table_name) if config.stream_table_name else None
        self.deltas = DeltaWriter(engine, log, io=self._io, interval_s=config.stream_interval_s)
        self.chunks: Chunks | None = None
        if config.batch_queue_url is not None:
            assert batches is not None and config.control_queue_url is not None
            self.chunks = Chunks(
                engine=engine,
                admission=self.admission,
                blobs=self.service.blobs,
                ledger=batches,
                control=ControlQueue(config.control_queue_url),
                io=self._io,
                faults=self.faults,
                retry_delay_s=config.retry_delay_s,
                served_models=config.served_models,
            )
        self.runner = Runner(
            config,
            engine,
            jobs=self.service.worker,
            outcomes=self.service.outcomes,
            admission=self.admission,
            progress=self.progress,
            deltas=self.deltas,
            announcer=Announcer(
                self.service.outcomes,
                events=events,
                io=self._io,
                webhooks=WebhookQueues(config.webhook_queue_urls) if config.webhook_queue_urls else None,
            ),
            policy=self.policy,
            faults=self.faults,
            metrics=self.metrics,
            chunks=self.chunks,
            io=self._io,
        )
        self.lanes = open_lanes(
            config,
            engine.capacity,
            jobs=jobs,
            admission=self.admission,
            held=self._inflight,
            stopping=self._stopping.is_set,
            io=self._io,
        )
        self.receiver = Receiver(
            held=self._inflight,
            stopping=self._stopping.is_set,
            io=self._io,
            received=self.policy.received,
            start=self._start,
            # One tenant holds at most held_messages' worth of engine rows; the fair room beyond it is only ever filled by other tenants'.
            share=TenantShare(config.held_messages(engine.capacity)),
            visibility_timeout_s=config.visibility_timeout_s,
            receive_wait_s=config.receive_wait_s,
        )

    @property
    def jobs_finished(self) -> int:
        """Jobs this worker brought to succeeded."""
        return self.runner.jobs_finished

    @property
    def engine_dead(self) -> FatalEngineError | None:
        """Set when the engine died; ``run`` then returns early."""
        return self.runner.engine_dead

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def stop(self) -> None:
        self._stopping.set()

    def _start_timed_out(self) -> None:
        """The model's sync or the engine's start outlasted ``start_timeout_s``: exit, holding no message, so that the
        task is replaced and its GPU freed (the event loop may be blocked: this runs on the deadline's thread)."""
        logger.error(
            "the engine did not start within %g s (%s=%g); exiting with %d",
            self.config.start_timeout_s,
            ENV_START_TIMEOUT_S,
            self.config.start_timeout_s,
            EXIT_START_TIMEOUT,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_START_TIMEOUT)

    # --- the loops --------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Receive and run claims until ``stop``; then drain and hand back what is left."""
        asyncio.get_running_loop().set_default_executor(self._pool)
        # Weights not uploaded yet are waited for, the task healthy, before the start's deadline runs (model_source).
        if self.model_source is not None and not await self._io(
            self.model_source.wait_for_weights, stopping=self._stopping.is_set, beat=self.health.touch
        ):
            self._pool.shutdown(wait=False, cancel_futures=True)
            return
        # Fetching and loading a model take minutes, and vLLM builds its engine in the loop's thread: a thread ends a
        # start that outlasts its deadline. The health file is touched only once the engine has started.
        with StartDeadline(self.config.start_timeout_s, self._start_timed_out):
            if self.model_source is not None:
                await self._io(self.model_source.sync)
            await self.engine.start()
        self.health.touch()
        receivers = max(1, min(4, -(-self.engine.capacity // settings.RECEIVE_BATCH_SIZE)))
        logger.info(
            "worker started: engine=%s capacity=%d receivers=%d lanes=%s",
            self.engine.name,
            self.engine.capacity,
            receivers,
            ",".join(self.lanes),
        )
        heartbeat = asyncio.create_task(self._heartbeat())
        progress = asyncio.create_task(self.progress.run()) if self.config.progress_interval_s > 0 else None
        deltas = asyncio.create_task(self.deltas.run()) if self.deltas.log is not None else None
        try:
            await self.receiver.run(self.lanes, receivers)
            await self._drain()
        finally:
            heartbeat.cancel()
            if progress is not None:
                progress.cancel()
            if deltas is not None:
                deltas.cancel()
            await self.runner.announcer.close()
            for lane in self.lanes.values():
                await lane.deletes.close()
            self.metrics.flush()
            await self.policy.clear()
            try:
                await self.engine.close()
            except Exception:  # a dead engine may not shut down cleanly; the exit status must still say it died
                logger.exception("the engine did not close cleanly")
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _start(self, flight: InFlight, lane: Lane, parse_error: Exception | None) -> None:
        """Hold the message and run its claim."""
        message = flight.message
        self._inflight[message.message_id] = flight
        flight.task = asyncio.create_task(self._settle(flight, lane, parse_error))
        flight.task.add_done_callback(lambda _: asyncio.create_task(self._finished(flight, lane)))

    async def _settle(self, flight: InFlight, lane: Lane, parse_error: Exception | None) -> None:
        if flight.claim is not None and any(
            other.running and other.ident == flight.ident for other in self._inflight.values() if other is not flight
        ):
            # SQS delivered the message again while this worker still runs its claim (delivery is at least once).
            # Leave this copy be: it reappears after its visibility timeout, finds the claim done, and is deleted.
            logger.info("%s: duplicate delivery while it runs here; leaving the copy", flight.ident)
            outcome = Outcome.leave("duplicate")
        else:
            flight.running = True
            outcome = await self.runner.run(flight, parse_error=parse_error)
        await self._act(flight, lane, outcome)

    async def _act(self, flight: InFlight, lane: Lane, outcome: Outcome) -> None:
        """Do what the runner decided with the flight's message."""
        message = flight.message
        if outcome.action is Action.DELETE:
            self.faults.at("before_delete", flight.ident)
            await lane.deletes.add(message.receipt_handle)
        elif outcome.action in (Action.RETRY, Action.REQUEUE):
            self._inflight.pop(message.message_id, None)  # no heartbeat may extend it again
            await self._io(put_back, lane.queue, flight, outcome)
        elif outcome.action is Action.HAND_BACK:
            self._handback[message.message_id] = flight
            if self.engine_dead is not None:
                self.stop()

    async def _finished(self, flight: InFlight, lane: Lane) -> None:
        self._inflight.pop(flight.message.message_id, None)
        if flight.running:
            self.runner.forget(flight)
        await lane.held.give(1)
        if not self._stopping.is_set():
            await self.policy.sync()

    async def _heartbeat(self) -> None:
        """Keep held messages invisible while their claims run, let the runner look at them (cancelled jobs, stopped
        batches), renew the task protection of a busy worker, flush the metrics, and keep the health file fresh: a
        beat that stops coming is what the container health check sees."""
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            self.beats += 1
            self.health.touch()
            await self._flush_metrics()
            await self.policy.watch()
            flights = list(self._inflight.values())
            if not flights:
                continue
            await self.policy.renew()
            try:
                await self._set_visibility([f.message for f in flights], self.config.visibility_timeout_s)
                await self.runner.beat(flights)
            except Exception:
                logger.exception("heartbeat failed; retrying at the next beat")

    async def _flush_metrics(self) -> None:
        record = self.metrics.take_record()
        if record is not None:
            await self._io(self.metrics.write, record)

    async def _set_visibility(self, messages: list[QueueMessage], timeout_s: int) -> None:
        """ChangeMessageVisibilityBatch for messages of either lane, each on its own queue (messages without a queue
        are the job queue's)."""
        for lane in self.lanes.values():
            handles = [
                m.receipt_handle
                for m in messages
                if m.queue_url == lane.queue.url or (lane.name == INTERACTIVE and m.queue_url is None)
            ]
            if handles:
                await self._io(lane.queue.change_visibility_batch, handles, timeout_s)

    async def _drain(self) -> None:
        """After a stop: let running claims finish within the drain timeout, then abort the rest and make their
        messages visible at once, so another worker picks them up now rather than after the visibility timeout.
        After the engine died, what is in the engine is handed back at once: it will never finish."""
        if self.engine_dead is not None:
            for flight in list(self._inflight.values()):
                if flight.in_engine and flight.task:
                    flight.task.cancel()
                    self._handback[flight.message.message_id] = flight
        pending = [f.task for f in self._inflight.values() if f.task and f.message.message_id not in self._handback]
        if pending:
            logger.info("draining %d claims for up to %.0f s", len(pending), self.config.drain_timeout_s)
            await asyncio.wait(pending, timeout=self.config.drain_timeout_s)
        left = [f for f in self._inflight.values() if f.message.message_id not in self._handback]
        for flight in left:
            if flight.task:
                flight.task.cancel()
            if flight.running and flight.job_id and self.engine_dead is None:
                await self.engine.abort(flight.job_id)
            self._handback[flight.message.message_id] = flight
        if not self._handback:
            return
        logger.info("handing back %d unfinished claims", len(self._handback))
        # Their jobs' leases first: the worker that receives them next starts them at once.
        await self.runner.release(list(self._handback.values()))
        await self._set_visibility([flight.message for flight in self._handback.values()], 0)


def put_back(queue: JobQueue, flight: InFlight, outcome: Outcome) -> None:
    """A message the worker lets go of without deleting it: visible again after ``outcome.retry_in_s`` (``RETRY``), or
    sent again as a new message hidden that long (``REQUEUE``); if that fails, it returns after its visibility
    timeout."""
    message = flight.message
    try:
        if outcome.action is Action.REQUEUE:
            failed = queue.requeue([(message, flight.tenant or "")], delay_s=outcome.retry_in_s)
        else:
            failed = queue.change_visibility_batch([message.receipt_handle], outcome.retry_in_s)
    except Exception:
        logger.exception("could not put back %s", message.message_id)
        failed = [message.receipt_handle]
    if failed:
        logger.warning("%s not put back (%s); it returns after its visibility timeout", message.message_id, outcome)
