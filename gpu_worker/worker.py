"""The GPU worker: keeps the engine full of jobs from the claim-check queue.

Up to ``engine.capacity`` jobs are in the engine at once, and a few more messages are held beyond that (prefetch) so
that reading payloads and writing results overlap generation instead of leaving engine slots idle: messages are
received in batches of 10, each job's payload is fetched while it waits for an engine slot, and each job finishes on
its own. A job is ``running`` (``started_at``, its ``started`` webhook, its job.started event) only once it has an
engine slot: while it waits in the prefetch buffer it stays ``queued``. While it runs, its tokens so far are written
to it and published every ``progress_interval_s`` (``gpu_worker.progress``). Visibility of held messages
is extended in batches while they run; deletes are batched. A job that cannot succeed becomes a ``failed`` job with a
reason; only infrastructure faults and transient engine faults are left to SQS redelivery.

What each fault leads to (docs/guarantees.md has the client's view):

* crash (SIGKILL, lost host): nothing is acknowledged before its effects are stored, so the held messages come back
  after the visibility timeout and another worker finishes them. Messages are received with this worker's
  ``visibility_timeout_s`` (``VisibilityTimeout`` on the receive, not the queue's default), so that window is the
  worker's setting from the first moment it holds a message. State moves are conditional and the result object is
  written once (``put_json_once``), so a job that runs twice still has one result and one final state; the
  ``notified`` flag lets a redelivery send a notification that a crash kept back.
* SIGTERM (scale-in, deployment): stop receiving, let running jobs finish for ``drain_timeout_s``, then abort the rest
  and make their messages visible at once. ECS task scale-in protection is held as ``task_protection`` says (by
  default while a job that could outlast the drain runs; ``gpu_worker.task_protection``).
* a job that can never succeed: ``failed`` with a reason, message deleted, no retries burnt.
* a transient fault (throttling that outlasted botocore's retries, engine out of memory): the message is kept and
  made visible again after a short backoff (``transient_retry_delay_s`` doubled per receive); after the queue's max
  receive count SQS moves it to the DLQ, whose handler fails the job.
* a dead engine (``FatalEngineError``: vLLM's EngineDeadError, a CUDA fault): nothing more can run in this process,
  and retrying here would burn every queued job's receives into the DLQ. The worker stops receiving, cancels what is
  in the engine, lets jobs past it store their results (``drain_timeout_s``), makes every message it still holds
  visible at once (their jobs keep the one receive and attempt they had), and ``run`` returns with ``engine_dead``
  set: ``python -m gpu_worker`` exits with ``EXIT_ENGINE_DEAD`` so that ECS replaces the task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from pydantic import ValidationError

from async_inference import config as env
from async_inference import settings
from async_inference.aws import (
    MAX_CONCURRENT_REQUESTS,
    Blobs,
    ConnectionStore,
    ControlQueue,
    JobEvents,
    JobQueue,
    JobStore,
    PayloadTooLarge,
    QueueMessage,
    WebhookQueue,
)
from async_inference.config import ServiceConfig
from async_inference.jobs import FINAL_STATES, JobStatus
from async_inference.served_models import ServedModels
from async_inference.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ChunkClaimCheck,
    ClaimCheck,
    Job,
    JobActivity,
    JobProgress,
    utcnow,
)
from async_inference.service import JobService, parse_request_body
from async_inference.webhooks.events import EVENT_STARTED, started_event
from gpu_worker.completions import chat_completion
from gpu_worker.engines.base import (
    Engine,
    Generation,
    GenerationAborted,
    FatalEngineError,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.chunks import BatchLedger, Chunks, is_chunk, lines_of
from gpu_worker.faults import Faults
from gpu_worker.health import HealthFile
from gpu_worker.lanes import BATCH, INTERACTIVE, Admission, BatchBudget, default_reserve
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.model_source import ModelSource
from gpu_worker.progress import ProgressReporter
from gpu_worker.task_protection import DEFAULT_RENEW_S, TaskProtection, outlasts_drain

logger = logging.getLogger("gpu_worker")
T = TypeVar("T")
# The exit status of a worker whose engine died (``python -m gpu_worker``): its messages were handed back, and its
# supervisor must start a fresh process. 2 is taken by bad settings (gpu_worker.__main__).
EXIT_ENGINE_DEAD = 3
# How long a finished job's delete may wait for nine others. Its message is no longer extended by the heartbeat but
# still has most of a visibility timeout left, so a short wait costs nothing and saves most DeleteMessageBatch calls.
DELETE_BATCH_DELAY_S = 0.5
# How long a finished job's notification may wait for others to share a PublishBatch: notifications arrive up to this
# much later, for a tenth of the SNS and DynamoDB requests at load. job.started events wait as long.
NOTIFY_BATCH_DELAY_S = 0.1
MISSING_PAYLOAD = "the request payload is missing from S3 or over the size limit"


# --- Configuration --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerConfig:
    """How a ``Worker`` runs; ``gpu_worker.config.WorkerSettings`` builds it from the environment."""

    service: ServiceConfig
    heartbeat_interval_s: float = settings.HEARTBEAT_INTERVAL_S
    visibility_timeout_s: int = settings.VISIBILITY_TIMEOUT_S
    receive_wait_s: int = settings.RECEIVE_WAIT_TIME_S
    # ECS sends SIGTERM, then SIGKILL after the task's stop timeout (120 s at most on EC2): drain inside it.
    drain_timeout_s: float = 90.0
    # A message left for redelivery after a transient fault comes back after this, doubled per receive (capped at
    # the visibility timeout). SQS takes whole seconds; 0 means at once.
    transient_retry_delay_s: int = 5
    # Messages held beyond the engine's capacity. A job spends part of its life in S3/DynamoDB/SNS calls; if those held
    # engine slots, the engine would idle while they ran. None: max(10, capacity // 2). At a quarter the held budget was
    # always full in `make bench` and the batch ran 85% full; the bench records what this default gives.
    prefetch: int | None = None
    # Where "started" webhook events go; None: jobs that ask for them do not get them (logged).
    webhook_queue_url: str | None = None
    # The job event topic (job.started, job.progress, for the WebSocket API); None: no such events are published.
    events_topic_arn: str | None = None
    # The WebSocket connection table: job.progress goes out only for jobs a connection follows (None: for every job).
    connections_table_name: str | None = None
    # Seconds between progress beats (gpu_worker.progress); 0: no progress is written or published.
    progress_interval_s: float = settings.PROGRESS_INTERVAL_S
    # A busy worker renews its ECS task protection this often (it expires after task_protection.EXPIRES_IN_MINUTES).
    task_protection_renew_s: float = DEFAULT_RENEW_S
    # When to hold it (gpu_worker.task_protection): long_jobs, busy or off; and the decode rate long_jobs expects.
    task_protection: str = env.DEFAULT_TASK_PROTECTION
    task_protection_tokens_per_s: float = env.DEFAULT_TASK_PROTECTION_TOKENS_PER_S
    # The file the container health check reads (gpu_worker.health); None: none is kept (in-process tests, benches).
    health_file: Path | None = None
    # The batch lane (gpu_worker.lanes, docs/design/batches.md): its queue and the control queue that finalize
    # messages go to. None: the worker serves the interactive lane only.
    batch_queue_url: str | None = None
    control_queue_url: str | None = None
    # Engine slots batch lines leave free for interactive jobs. None: lanes.default_reserve(capacity).
    interactive_reserve: int | None = None
    # The model names this worker runs (SERVED_MODELS); a batch line for another is a 404 model_not_found line.
    # None: any name.
    served_models: ServedModels | None = None

    def __post_init__(self) -> None:
        if (self.batch_queue_url is None) != (self.control_queue_url is None):
            raise ValueError("batch_queue_url and control_queue_url go together: the batch lane sends each batch's "
                             "finalize to the control queue")

    def held_messages(self, capacity: int) -> int:
        """How many messages a worker holds at most: the engine's capacity plus the prefetch."""
        return capacity + (self.prefetch if self.prefetch is not None else max(settings.RECEIVE_BATCH_SIZE, capacity // 2))

    def reserve(self, capacity: int) -> int:
        """Engine slots kept free for interactive jobs (``interactive_reserve``, or the default for ``capacity``)."""
        return default_reserve(capacity) if self.interactive_reserve is None else self.interactive_reserve

    def retry_delay_s(self, receive_count: int) -> int:
        """Seconds a message stays hidden after its ``receive_count``-th receive ended in a transient fault."""
        return min(self.transient_retry_delay_s * 2 ** max(0, receive_count - 1), self.visibility_timeout_s)


# --- I/O helpers ----------------------------------------------------------------------------------------------------


class Slots:
    """Free places in the engine's batch: a receiver takes up to 10 before it asks SQS for that many messages."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self._changed = asyncio.Condition()

    async def take(self, most: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.free > 0)
            taken = min(most, self.free)
            self.free -= taken
            return taken

    async def give(self, count: int) -> None:
        async with self._changed:
            self.free += count
            self._changed.notify_all()


class Batcher:
    """Gathers items and hands them to ``flush`` in groups of up to ``max_size``, at most ``max_delay_s`` late.
    Turns one SQS DeleteMessage (or SNS Publish) per job into one batch request per ten.

    ``flush`` returns one result per item (or None when there is nothing to report); ``add`` returns a future of the
    item's result, which callers that must know (was my notification published?) await.
    """

    def __init__(self, flush: Callable[[list[Any]], Awaitable[list[Any] | None]], *, max_size: int = 10,
                 max_delay_s: float = 0.05):
        self._flush = flush
        self._max_size = max_size
        self._max_delay_s = max_delay_s
        self._items: list[tuple[Any, asyncio.Future[Any]]] = []
        self._timer: asyncio.Task[None] | None = None

    async def add(self, item: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._items.append((item, future))
        if len(self._items) >= self._max_size:
            await self._drain()
        elif self._timer is None:
            self._timer = asyncio.create_task(self._later())
        return future

    async def _later(self) -> None:
        await asyncio.sleep(self._max_delay_s)
        self._timer = None
        await self._drain()

    async def _drain(self) -> None:
        while self._items:
            chunk, self._items = self._items[: self._max_size], self._items[self._max_size :]
            try:
                results = await self._flush([item for item, _ in chunk])
            except Exception as exc:  # every item of the chunk shares the failure
                for _, future in chunk:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for index, (_, future) in enumerate(chunk):
                if not future.done():
                    future.set_result(results[index] if results is not None else None)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._drain()


@dataclass
class Lane:
    """A queue the worker receives from, the budget of messages it may hold from it, and its batched deletes."""

    name: str  # lanes.INTERACTIVE or lanes.BATCH
    queue: JobQueue
    held: Slots | BatchBudget
    deletes: Batcher


@dataclass
class InFlight:
    message: QueueMessage
    job_id: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    in_engine: bool = False  # waiting for an engine slot or generating
    lane: str = INTERACTIVE
    lines: int = 1  # engine requests the message stands for (a chunk's lines)
    chunk: str | None = None  # "batch_id/chunk" of a chunk claim check
    protect: bool = False  # a job that could outlast the drain (task_protection "long_jobs")
    started: float = 0.0  # time.monotonic() when its generation began


# --- The worker -----------------------------------------------------------------------------------------------------


class Worker:
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
    ) -> None:
        """``model_source``: the model's files to sync before the engine starts (``MODEL_S3_URI``); ``batches``: the
        batch table's ``BatchStore``, which the batch lane needs (``config.batch_queue_url``)."""
        self.config = config
        self.engine = engine
        self.service = service or JobService.from_config(config.service)
        self.store: JobStore = self.service.store
        self.blobs: Blobs = self.service.blobs
        self.queue: JobQueue = self.service.queue
        self._started_queue = WebhookQueue(config.webhook_queue_url) if config.webhook_queue_url else None
        if config.batch_queue_url is not None and batches is None:
            raise ValueError("batch_queue_url is set but no BatchStore was given: the batch lane counts chunks in it")
        self.batches = batches
        self._batch_queue = JobQueue(config.batch_queue_url) if config.batch_queue_url else None
        self._control = ControlQueue(config.control_queue_url) if config.control_queue_url else None
        self._events = JobEvents(config.events_topic_arn) if config.events_topic_arn else None
        self.progress = ProgressReporter(engine, self.store, self._events, interval_s=config.progress_interval_s,
                                         io=self._io, followers=ConnectionStore(config.connections_table_name)
                                         if config.connections_table_name else None)
        self._announcements: set[asyncio.Task[None]] = set()  # started webhooks and events on their way
        self.health = HealthFile(config.health_file)
        self.metrics = metrics or WorkerMetrics(enabled=False)
        self.model_source = model_source
        self.protection = protection or TaskProtection(None)
        self.faults = faults or Faults()
        self.faults.install(blobs=self.blobs, store=self.store, engine=self.engine)
        self._protection_lock: asyncio.Lock | None = None  # made in run(), on the loop
        self._inflight: dict[str, InFlight] = {}  # by message id
        self._stopping = asyncio.Event()
        self._slots: Slots  # messages held
        # Jobs and batch lines inside the engine, interactive first (gpu_worker.lanes); `async with` takes an
        # interactive slot, as the semaphore it replaces did.
        self._engine_slots: Admission
        self._lanes: dict[str, Lane] = {}
        self.chunks: Chunks | None = None  # the batch lane's chunk runner, made in run()
        # Jobs the heartbeat found cancelled. An engine ignores an abort for a request it has not seen yet, so a job
        # cancelled while it waits for an engine slot is stopped here instead.
        self._cancelled: set[str] = set()
        self._deletes: Batcher
        self._notices: Batcher  # (job, result or None) -> published?
        self._activities: Batcher  # job.started events
        # boto3 is blocking: its calls run in a pool sized for one request per in-flight job plus the loops (and as
        # many again for the batch lane's messages).
        held = config.held_messages(engine.capacity) * (2 if self._batch_queue else 1)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(MAX_CONCURRENT_REQUESTS, held + 8), thread_name_prefix="io"
        )
        self.jobs_finished = 0  # jobs this worker brought to succeeded
        self.engine_dead: FatalEngineError | None = None  # set when the engine died; run() then returns early
        self._handback: dict[str, QueueMessage] = {}  # messages of jobs the dead engine could not run, by id

    @property
    def admission(self) -> Admission:
        """The engine's slots, shared by the two lanes (its counters: in_engine, preemptions)."""
        return self._engine_slots

    async def _io(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    # --- one job --------------------------------------------------------------------------------------------------

    async def process(self, message: QueueMessage, flight: InFlight) -> None:
        """Run one claim check to a final state, or leave its message for redelivery on an infrastructure fault."""
        if is_chunk(message.body):
            return await self._process_chunk(message, flight)
        try:
            claim = ClaimCheck.model_validate_json(message.body)
        except ValidationError:
            logger.error("poison message %s is not a claim check; deleting it", message.message_id)
            await self._lane_of(message).deletes.add(message.receipt_handle)
            return
        if any(other.job_id == claim.job_id for other in self._inflight.values() if other is not flight):
            # SQS delivered the message again while this worker still runs its job (delivery is at least once). Leave
            # this copy be: it reappears after its visibility timeout, finds the job final, and is deleted then.
            logger.info("job %s: duplicate delivery while the job runs here; leaving the copy", claim.job_id)
            return
        flight.job_id = claim.job_id
        try:
            done = await self._run_claim(claim, flight)
        except FatalEngineError as exc:
            self._engine_died(exc, message)
            return
        except Exception:
            # S3/DynamoDB/SNS faults that survived botocore's retries: SQS redelivers after the backoff, and the DLQ
            # takes the message after the max receive count.
            logger.exception("job %s: infrastructure fault, leaving it for redelivery", claim.job_id)
            done = False
        if done:
            self.faults.at("before_delete", claim.job_id)
            await self._lane_of(message).deletes.add(message.receipt_handle)
        else:
            await self._retry_later(message)

    async def _process_chunk(self, message: QueueMessage, flight: InFlight) -> None:
        """Run one chunk claim check (``gpu_worker.chunks``): the same outcomes as ``process`` for a job."""
        try:
            claim = ChunkClaimCheck.model_validate_json(message.body)
        except ValidationError:
            logger.error("poison message %s is not a chunk claim check; deleting it", message.message_id)
            await self._lane_of(message).deletes.add(message.receipt_handle)
            return
        ident = f"{claim.batch_id}/{claim.chunk}"
        if self.chunks is None:
            logger.error("chunk %s reached a worker without the batch lane; leaving it for redelivery", ident)
            return await self._retry_later(message)
        if any(other.chunk == ident for other in self._inflight.values() if other is not flight):
            logger.info("chunk %s: duplicate delivery while the chunk runs here; leaving the copy", ident)
            return
        flight.chunk = ident

        def entered() -> None:
            flight.in_engine = True

        try:
            done = await self.chunks.run(claim, receive_count=message.receive_count, entered=entered)
        except FatalEngineError as exc:
            self._engine_died(exc, message)
            return
        except Exception:
            logger.exception("chunk %s: infrastructure fault, leaving it for redelivery", ident)
            done = False
        if done:
            self.faults.at("before_delete", ident)
            await self._lane_of(message).deletes.add(message.receipt_handle)
        else:
            await self._retry_later(message)

    def _lane_of(self, message: QueueMessage) -> Lane:
        """The lane a message was received in (messages without a queue are the job queue's)."""
        for lane in self._lanes.values():
            if lane.queue.url == message.queue_url:
                return lane
        return self._lanes[INTERACTIVE]

    async def _set_visibility(self, messages: list[QueueMessage], timeout_s: int) -> None:
        """ChangeMessageVisibilityBatch for messages of either lane, each on its own queue."""
        for lane in self._lanes.values():
            handles = [m.receipt_handle for m in messages if self._lane_of(m) is lane]
            if handles:
                await self._io(lane.queue.change_visibility_batch, handles, timeout_s)

    async def _retry_later(self, message: QueueMessage) -> None:
        """Leave the message for redelivery, visible again after the backoff rather than the visibility timeout."""
        self._inflight.pop(message.message_id, None)  # no heartbeat may extend it again
        delay = self.config.retry_delay_s(message.receive_count)
        try:
            await self._set_visibility([message], delay)
        except Exception:
            logger.exception("could not shorten the visibility of %s; it returns after the timeout", message.message_id)

    def _engine_died(self, exc: FatalEngineError, message: QueueMessage) -> None:
        """Keep ``message`` for the hand-back, and stop the worker at the first death."""
        self._handback[message.message_id] = message
        if self.engine_dead is None:
            logger.error("the engine is dead (%s): stopping, and handing every held message back", exc)
            self.engine_dead = exc
            self.stop()

    async def _run_claim(self, claim: ClaimCheck, flight: InFlight) -> bool:
        """True when the message is finished with (delete it), False to leave it for redelivery."""
        if utcnow() > claim.deadline:
            job = await self._io(self.store.get, claim.job_id)
            if job is not None and job.status is JobStatus.QUEUED:
                return await self._finish(job, JobStatus.EXPIRED, error="still queued at its deadline")
        # Read while the job is still queued: the read overlaps the generation of the jobs in the engine.
        raw = await self._read_payload(claim)
        request, reason = parse_request_body(raw) if raw is not None else (None, MISSING_PAYLOAD)
        if request is None:
            # It never ran (attempts counts runs): failed from queued, or from running for a redelivery after a
            # crash, never from a final state.
            return await self._finish(claim.job_id, JobStatus.FAILED, error=reason,
                                      only_from={JobStatus.QUEUED, JobStatus.RUNNING})

        if self.config.task_protection == "long_jobs" and outlasts_drain(
            request.max_tokens, tokens_per_s=self.config.task_protection_tokens_per_s,
            drain_timeout_s=self.config.drain_timeout_s,
        ):
            flight.protect = True
            await self._sync_protection()

        job, outcome = await self._in_engine(claim, flight, request)
        if job is None:
            return await self._not_runnable(claim.job_id)
        if isinstance(outcome, asyncio.TimeoutError):
            await self.engine.abort(job.job_id)
            return await self._finish(job, JobStatus.FAILED, error=f"execution timed out after {claim.timeout_s} s")
        if isinstance(outcome, GenerationAborted):
            return True  # cancelled while running: the cancel already stored the final state and notified
        if isinstance(outcome, PermanentEngineError):
            return await self._finish(job, JobStatus.FAILED, error=str(outcome))
        if isinstance(outcome, TransientEngineError):
            logger.warning("job %s: transient engine fault (%s), leaving it for redelivery", job.job_id, outcome)
            return False
        assert isinstance(outcome, Generation)
        generation, started = outcome, flight.started
        logger.debug("job %s generated in %.3f s", job.job_id, time.monotonic() - started)

        completion = chat_completion(generation, completion_id=f"chatcmpl-{job.job_id.removeprefix('job_')}",
                                     model=job.model or "", job_id=job.job_id)
        return await self._finish(job, JobStatus.SUCCEEDED, result=completion, generation_started=started)

    async def _in_engine(self, claim: ClaimCheck, flight: InFlight, request: ChatCompletionRequest
                         ) -> tuple[Job | None, Generation | BaseException | None]:
        """Take one of the engine's slots, move the job to running (None when it may not run: cancelled, final...),
        and generate; the job and the generation or the engine error that ended it. The slot is free again before
        the result is stored. The execution timeout counts from the start of the generation."""
        flight.in_engine = True
        job: Job | None = None
        first = False  # a preempted job waits again at the head of its lane
        try:
            while True:
                async with self._engine_slots.slot(flight.lane, claim.job_id, first=first) as slot:
                    if self.engine_dead is not None:
                        raise FatalEngineError(f"not started: the engine died ({self.engine_dead})")
                    if job is None:  # its first slot: it becomes running (once, however often it is preempted)
                        job = await self._start_running(claim, flight)
                        if job is None:
                            return None, None
                    if not slot.preempted:
                        self.progress.track(job)
                        try:
                            if job.job_id in self._cancelled:
                                raise GenerationAborted(job.job_id)
                            generation = await asyncio.wait_for(self.engine.generate(job.job_id, request),
                                                                timeout=claim.timeout_s)
                            return job, generation
                        except GenerationAborted as exc:
                            if not slot.preempted:  # cancelled, not preempted for an interactive job
                                return job, exc
                        except (asyncio.TimeoutError, PermanentEngineError, TransientEngineError) as exc:
                            return job, exc
                        finally:
                            self.progress.forget(job.job_id)
                first = True  # a batch-lane job preempted for an interactive one runs again from the start
        finally:
            flight.in_engine = False

    async def _start_running(self, claim: ClaimCheck, flight: InFlight) -> Job | None:
        """Move the job to running as it takes its engine slot, and announce it; None when it may not run."""
        now = utcnow()
        job = await self._io(
            self.store.transition, claim.job_id, JobStatus.RUNNING, count_attempt=True, started_at=now,
            progress=JobProgress(completion_tokens=0, updated_at=now),
        )
        if job is None:
            return None
        self._announce_start(job)
        flight.started = time.monotonic()
        self.metrics.started((utcnow() - job.created_at).total_seconds())
        self.faults.at("before_engine", job.job_id)
        return job

    def _announce_start(self, job: Job) -> None:
        """Send the job's started webhook (if it asked for one) and its job.started event beside its generation:
        neither waits for the other, and neither can fail the job."""
        task = asyncio.create_task(self._send_start(job))
        self._announcements.add(task)
        task.add_done_callback(self._announcements.discard)

    async def _send_start(self, job: Job) -> None:
        if job.webhook and EVENT_STARTED in job.webhook.events:
            if self._started_queue is None:
                logger.warning("job %s asked for a started webhook but no webhook queue is configured", job.job_id)
            else:  # never raises: a lost "started" must not cost the run
                await self._io(started_event, job, self._started_queue)
        if self._events is not None:
            await self._activities.add(JobActivity(
                event="job.started", job_id=job.job_id, tenant=job.tenant, model=job.model, started_at=job.started_at,
                progress=job.progress,
            ))

    async def _publish_activities(self, activities: list[JobActivity]) -> list[bool]:
        assert self._events is not None
        try:
            return await self._io(self._events.publish_batch, activities)
        except Exception:
            logger.exception("%d job.started events not published", len(activities))
            return [False] * len(activities)

    async def _finish(self, job: Job | str, target: JobStatus, *, result: ChatCompletion | None = None,
                      generation_started: float | None = None, **fields: Any) -> bool:
        """End a job, succeeded or not, in the one order a crash can interrupt safely: result object (written once),
        final state, notification (batched). True when the message is done with, False to leave it for redelivery.
        ``job`` is the job, or its id for one that never ran (a payload it cannot run with: a result needs the job).
        ``generation_started`` (time.monotonic()) times the processing of a result."""
        job_id = job if isinstance(job, str) else job.job_id
        processing_s = None
        if result is not None:
            assert isinstance(job, Job)
            generated_tokens = result.usage.completion_tokens
            result, result_fields = await self._io(self.service.store_result, job, result)
            if generation_started is not None:
                processing_s = time.monotonic() - generation_started
            fields.update(result_fields)
            self.faults.at("after_result_write", job_id)
        finished = await self._io(self.service.end, job, target, **fields)
        self.faults.at("after_state_write", job_id)
        if finished is None:
            # Cancelled meanwhile, or another run of the job finished first. The message is done with only once that
            # end was notified: if the other run died before publishing, this message is the one left to do it.
            return await self._not_runnable(job_id)
        if target is JobStatus.SUCCEEDED and processing_s is not None:
            self.metrics.succeeded(processing_s=processing_s, completion_tokens=generated_tokens)
        elif target is JobStatus.FAILED:
            self.metrics.failed()
        if not await (await self._notices.add((finished, result))):
            # The job is final but its notification did not go out: leave the message, and its redelivery finds the
            # job final and not notified, and sends it.
            return False
        if target is JobStatus.SUCCEEDED:
            self.jobs_finished += 1
        return True

    async def _not_runnable(self, job_id: str) -> bool:
        """The job could not be moved to running: find out why and whether the message is done with."""
        job = await self._io(self.store.get, job_id)
        if job is None:
            logger.error("claim check for unknown job %s; deleting it", job_id)
            return True
        if job.status in FINAL_STATES:
            if job.notified:
                return True
            # Final but not notified: either its finisher crashed between the state write and the publish, or it is
            # publishing right now (a duplicate delivery of the same message). Only the first needs us; the finisher
            # would have published within its visibility timeout, so until then look again later.
            finished_at = job.finished_at or job.updated_at
            if (utcnow() - finished_at).total_seconds() < self.config.visibility_timeout_s:
                return False
            await self._io(self.service.notify, job)
            return True
        return False  # e.g. still awaiting its upload: try again later

    async def _read_payload(self, claim: ClaimCheck) -> bytes | None:
        """The request body; None when it is missing or over the limit (either way the job can never run)."""
        try:
            return await self._io(self.blobs.get, claim.key, bucket=claim.bucket, max_bytes=settings.MAX_UPLOAD_BYTES)
        except (KeyError, PayloadTooLarge):
            return None

    # --- the loops ------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Receive and run jobs until ``stop``; then drain and hand back what is left."""
        asyncio.get_running_loop().set_default_executor(self._pool)
        # Fetching and loading a model take minutes, and vLLM builds its engine in the loop's thread: a thread keeps
        # the health file fresh meanwhile, the heartbeat afterwards.
        with self.health.kept_fresh(self.config.heartbeat_interval_s):
            if self.model_source is not None:
                await self._io(self.model_source.sync)
            await self.engine.start()
        self._slots = Slots(self.config.held_messages(self.engine.capacity))
        self._engine_slots = Admission(self.engine.capacity, reserve=self.config.reserve(self.engine.capacity),
                                       abort=self.engine.abort)
        self._protection_lock = asyncio.Lock()
        self._deletes = Batcher(self._delete_batch, max_delay_s=DELETE_BATCH_DELAY_S)
        self._notices = Batcher(self._notify_batch, max_delay_s=NOTIFY_BATCH_DELAY_S)
        self._lanes = {INTERACTIVE: Lane(INTERACTIVE, self.queue, self._slots, self._deletes)}
        if self._batch_queue is not None:
            self._lanes[BATCH] = self._batch_lane(self._batch_queue)
        self._activities = Batcher(self._publish_activities, max_delay_s=NOTIFY_BATCH_DELAY_S)
        receivers = max(1, min(4, -(-self.engine.capacity // settings.RECEIVE_BATCH_SIZE)))
        logger.info("worker started: engine=%s capacity=%d receivers=%d lanes=%s", self.engine.name,
                    self.engine.capacity, receivers, ",".join(self._lanes))
        heartbeat = asyncio.create_task(self._heartbeat())
        progress = asyncio.create_task(self.progress.run()) if self.config.progress_interval_s > 0 else None
        try:
            loops = [self._receive_loop() for _ in range(receivers)]
            if BATCH in self._lanes:
                loops.append(self._receive_loop(self._lanes[BATCH]))
            await asyncio.gather(*loops)
            await self._drain()
        finally:
            heartbeat.cancel()
            if progress is not None:
                progress.cancel()
            await asyncio.gather(*self._announcements, return_exceptions=True)
            await self._activities.close()
            await self._notices.close()
            for lane in self._lanes.values():
                await lane.deletes.close()
            self.metrics.flush()
            await self._protect(False)
            try:
                await self.engine.close()
            except Exception:  # a dead engine may not shut down cleanly; the exit status must still say it died
                logger.exception("the engine did not close cleanly")
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _batch_lane(self, queue: JobQueue) -> Lane:
        """The batch lane: its chunk runner, and a budget that keeps about one engine's worth of lines waiting."""
        assert self.batches is not None and self._control is not None
        self.chunks = Chunks(engine=self.engine, admission=self._engine_slots, blobs=self.blobs, ledger=self.batches,
                             control=self._control, io=self._io, faults=self.faults,
                             retry_delay_s=self.config.retry_delay_s, served_models=self.config.served_models)
        budget = BatchBudget(self._engine_slots, ahead=self.engine.capacity,
                             max_messages=self.config.held_messages(self.engine.capacity),
                             held=lambda: [f for f in self._inflight.values() if f.lane == BATCH],
                             stopping=self._stopping.is_set)
        deletes = Batcher(functools.partial(self._delete_batch, queue=queue), max_delay_s=DELETE_BATCH_DELAY_S)
        return Lane(BATCH, queue, budget, deletes)

    async def _protect(self, enabled: bool) -> None:
        """Set ECS task protection; serialized, so receivers racing to protect make one call, in order with clears."""
        assert self._protection_lock is not None
        async with self._protection_lock:
            await self.protection.set(enabled)

    def _wants_protection(self) -> bool:
        """Whether the jobs held now call for task protection, in this worker's ``task_protection`` mode."""
        if self.config.task_protection == "busy":
            return bool(self._inflight)
        if self.config.task_protection == "long_jobs":
            return any(flight.protect for flight in self._inflight.values())
        return False

    async def _sync_protection(self) -> None:
        """Hold task protection exactly while ``_wants_protection``; decided under the lock, so that an enable and a
        clear racing each other end as the jobs held at the end require."""
        assert self._protection_lock is not None
        async with self._protection_lock:
            await self.protection.set(self._wants_protection())

    async def _renew_protection(self) -> None:
        """Keep a held protection from expiring (and retry an enable that failed). Checked under the lock, so a
        worker whose protected jobs ended meanwhile is not protected again after its clear."""
        assert self._protection_lock is not None
        async with self._protection_lock:
            if self._wants_protection():
                await self.protection.set(True, renew_after_s=self.config.task_protection_renew_s)

    def stop(self) -> None:
        self._stopping.set()

    async def _receive_loop(self, lane: Lane | None = None) -> None:
        """Receive from one lane's queue (the job queue unless given) as long as its budget lets."""
        lane = lane or self._lanes[INTERACTIVE]
        while not self._stopping.is_set():
            taken = await lane.held.take(settings.RECEIVE_BATCH_SIZE)
            if self._stopping.is_set():
                await lane.held.give(taken)
                return
            try:
                messages = await self._io(
                    lane.queue.receive,
                    max_messages=taken,
                    wait_s=self.config.receive_wait_s,
                    visibility_timeout_s=self.config.visibility_timeout_s,
                )
            except Exception:
                logger.exception("receive failed; retrying in 1 s")
                await lane.held.give(taken)
                await asyncio.sleep(1)
                continue
            await lane.held.give(taken - len(messages))
            if self._stopping.is_set() and messages:
                # Received after the stop began: hand them straight back.
                await self._io(lane.queue.change_visibility_batch, [m.receipt_handle for m in messages], 0)
                await lane.held.give(len(messages))
                return
            if messages and not self._inflight and self.config.task_protection == "busy":
                await self._protect(True)
            for message in messages:
                self._start(message, lane.name)

    def _start(self, message: QueueMessage, lane: str = INTERACTIVE) -> None:
        flight = InFlight(message=message, lane=lane, lines=lines_of(message.body) if lane == BATCH else 1)
        self._inflight[message.message_id] = flight
        flight.task = asyncio.create_task(self.process(message, flight))
        flight.task.add_done_callback(lambda _: asyncio.create_task(self._finished(message.message_id, lane)))

    async def _finished(self, message_id: str, lane: str = INTERACTIVE) -> None:
        flight = self._inflight.pop(message_id, None)
        if flight is not None and flight.job_id:
            self._cancelled.discard(flight.job_id)
        await self._lanes[lane].held.give(1)
        if not self._stopping.is_set():
            await self._sync_protection()

    async def _notify_batch(self, finished: list[tuple[Job, ChatCompletion | None]]) -> list[bool]:
        return await self._io(self.service.notify_many, finished)

    async def _delete_batch(self, handles: list[str], queue: JobQueue | None = None) -> None:
        failed = await self._io((queue or self.queue).delete_batch, handles)
        if failed:
            logger.warning("%d deletes failed; those messages will be redelivered and found finished", len(failed))

    async def _heartbeat(self) -> None:
        """Keep held messages invisible while their jobs run, abort jobs cancelled while running (and stop the lines
        of cancelled or expired batches), renew the task protection of a busy worker, flush the metrics, and keep the
        health file fresh: a beat that stops coming is what the container health check sees."""
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            self.health.touch()
            await self._flush_metrics()
            flights = list(self._inflight.values())
            if not flights:
                continue
            await self._renew_protection()
            try:
                await self._set_visibility([f.message for f in flights], self.config.visibility_timeout_s)
                await self._abort_cancelled([f.job_id for f in flights if f.job_id])
                if self.chunks is not None:
                    await self.chunks.check_statuses()
            except Exception:
                logger.exception("heartbeat failed; retrying at the next beat")

    async def _flush_metrics(self) -> None:
        record = self.metrics.take_record()
        if record is not None:
            await self._io(self.metrics.write, record)

    async def _abort_cancelled(self, job_ids: list[str]) -> None:
        for start in range(0, len(job_ids), 100):
            jobs = await self._io(self.store.get_many, job_ids[start : start + 100])
            for job in jobs.values():
                if job.status is JobStatus.CANCELLED:
                    self._cancelled.add(job.job_id)
                    await self.engine.abort(job.job_id)

    async def _drain(self) -> None:
        """After a stop: let running jobs finish within the drain timeout, then abort the rest and make their
        messages visible at once, so another worker picks them up now rather than after the visibility timeout.
        After the engine died, what is in the engine is handed back at once: it will never finish."""
        if self.engine_dead is not None:
            for flight in list(self._inflight.values()):
                if flight.in_engine and flight.task:
                    flight.task.cancel()
                    self._handback[flight.message.message_id] = flight.message
        pending = [f.task for f in self._inflight.values() if f.task and f.message.message_id not in self._handback]
        if pending:
            logger.info("draining %d jobs for up to %.0f s", len(pending), self.config.drain_timeout_s)
            await asyncio.wait(pending, timeout=self.config.drain_timeout_s)
        left = [f for f in self._inflight.values() if f.message.message_id not in self._handback]
        for flight in left:
            if flight.task:
                flight.task.cancel()
            if flight.job_id and self.engine_dead is None:
                await self.engine.abort(flight.job_id)
            self._handback[flight.message.message_id] = flight.message
        if not self._handback:
            return
        logger.info("handing back %d unfinished jobs", len(self._handback))
        await self._set_visibility(list(self._handback.values()), 0)
