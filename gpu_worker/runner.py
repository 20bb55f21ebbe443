"""The claim runner: takes one claim of any kind (``gpu_worker.claims``) to its final state, through the job service's
worker side (``WorkerJobs``) and its ``JobOutcomes``, and says what becomes of its message (``Outcome``). It never
touches the queue: the pump (``gpu_worker.worker``) does.

A job (``ClaimCheck``): its payload is read while it waits for an engine slot; it becomes ``running`` (``started_at``,
its ``started`` webhook, its job.started event) only once it has a slot, and ends in the one order a crash can
interrupt safely: result object (written once), final state, notification. A batch chunk (``ChunkClaimCheck``):
``gpu_worker.chunks`` runs its lines. What each ending means for the message:

* stored (succeeded, failed with a reason, expired, cancelled; a chunk counted): ``delete``;
* a transient engine fault, or an S3/DynamoDB/SNS fault that outlasted botocore's retries: ``retry`` after the
  backoff (``transient_retry_delay_s`` doubled per receive); after the queue's max receive count SQS moves it to the
  DLQ, whose handler fails the job;
* the engine died (``FatalEngineError``): ``hand_back``; ``engine_dead`` is set and nothing more runs here;
* poison (not a claim): ``delete``; a claim of a kind this worker does not know (a newer producer's, mid-deploy):
  ``retry``, for a worker that knows it.

One job, one execution: a worker that starts a job takes its lease (``lease_owner``, ``lease_expires_ms``) for its
``visibility_timeout_s``, and renews it at the heartbeat, after its messages' visibility, once a third of it has
passed. Another worker that receives a copy of the claim check (a replayed upload, a redelivery) cannot start the
job while the lease stands: the copy is hidden until the holder's execution timeout would have ended (``retry``; one
receive per job's run, not one per visibility timeout, so a long job's copy does not reach the DLQ), and found final
then. A holder that
is gone (crashed: its messages come back after its visibility timeout) stops renewing, its lease lapses with its
visibility, and the worker that receives the message next takes the job over. A holder that finds its lease taken
(its heartbeat stalled past its visibility) aborts its generation and leaves its message alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from async_inference.endpoints import LineRequest
from async_inference.jobs import FINAL_STATES, JobStatus
from async_inference.jobs_service import JobOutcomes, JobResult, WorkerJobs, parse_request_body
from async_inference.schemas import (
    EMBEDDINGS_ENDPOINT,
    ChunkClaimCheck,
    ClaimCheck,
    EmbeddingClaimCheck,
    Job,
    JobProgress,
    utcnow,
)
from gpu_worker import answers
from gpu_worker.announce import Announcer
from gpu_worker.chunks import Chunks
from gpu_worker.claims import InFlight, Outcome, UnknownKind
from gpu_worker.config import WorkerConfig
from gpu_worker.deltas import DeltaWriter
from gpu_worker.engines.base import (
    Engine,
    FatalEngineError,
    Generation,
    GenerationAborted,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.engines.embedding import Embeddings
from gpu_worker.faults import Faults
from gpu_worker.lanes import Admission
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.progress import ProgressReporter
from gpu_worker.task_protection import Policy

logger = logging.getLogger("gpu_worker.runner")
IO = Callable[..., Awaitable[Any]]
MISSING_PAYLOAD = "the request payload is missing from S3 or over the size limit"
SQS_MAX_VISIBILITY_S = 12 * 60 * 60  # the longest a message can be hidden


class Runner:
    """Runs claims for one worker: ``run`` one to its final state; ``beat``: the heartbeat's checks on those running."""

    def __init__(
        self,
        config: WorkerConfig,
        engine: Engine,
        *,
        jobs: WorkerJobs,
        outcomes: JobOutcomes,
        admission: Admission,
        progress: ProgressReporter,
        announcer: Announcer,
        policy: Policy,
        faults: Faults,
        metrics: WorkerMetrics,
        chunks: Chunks | None,
        io: IO,
        deltas: DeltaWriter | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.jobs = jobs
        self.outcomes = outcomes
        self.admission = admission
        self.progress = progress
        self.deltas = deltas or DeltaWriter(engine, None, io=io)  # streamed jobs' text, as it decodes
        self.announcer = announcer
        self.policy = policy
        self.faults = faults
        self.metrics = metrics
        self.chunks = chunks
        self._io = io
        # One handler per kind of claim (gpu_worker.claims.Claim).
        self._handlers: dict[type, Callable[[Any, InFlight], Awaitable[Outcome]]] = {
            ClaimCheck: self._job,
            ChunkClaimCheck: self._chunk,
            EmbeddingClaimCheck: self._job,  # the same life, another request and answer (gpu_worker.answers)
        }
        # Jobs the heartbeat found cancelled. An engine ignores an abort for a request it has not seen yet, so a job
        # cancelled while it waits for an engine slot is stopped here instead.
        self.cancelled: set[str] = set()
        self.engine_dead: FatalEngineError | None = None  # set when the engine died: nothing more runs
        self.jobs_finished = 0  # jobs this worker brought to succeeded
        self.owner = f"worker-{uuid.uuid4().hex}"  # whose leases this worker's jobs hold
        self.lost: set[str] = set()  # jobs whose lease another worker took over while they ran here

    async def run(self, flight: InFlight, *, parse_error: Exception | None = None) -> Outcome:
        """Run the flight's claim to its final state; what to do with its message."""
        if flight.claim is None:
            if isinstance(parse_error, UnknownKind):
                logger.error(
                    "message %s: %s; leaving it for a worker that runs it", flight.message.message_id, parse_error
                )
                return self._retry(flight, "unknown kind")
            logger.error("poison message %s is not a claim check; deleting it", flight.message.message_id)
            return Outcome.delete("poison")
        try:
            return await self._handlers[type(flight.claim)](flight.claim, flight)
        except FatalEngineError as exc:
            if self.engine_dead is None:
                logger.error("the engine is dead (%s): stopping, and handing every held message back", exc)
                self.engine_dead = exc
            return Outcome.hand_back("engine dead")
        except Exception:
            # S3/DynamoDB/SNS faults that survived botocore's retries: SQS redelivers after the backoff, and the DLQ
            # takes the message after the max receive count.
            logger.exception("%s: infrastructure fault, leaving it for redelivery", flight.ident)
            return self._retry(flight, "infrastructure fault")

    def _retry(self, flight: InFlight, reason: str) -> Outcome:
        return Outcome.retry(self.config.retry_delay_s(flight.message.receive_count), reason)

    async def beat(self, flights: list[InFlight]) -> None:
        """The heartbeat's look at what runs here: abort jobs cancelled while they run, stop the lines of cancelled or
        expired batches."""
        job_ids = [f.job_id for f in flights if f.job_id]
        for start in range(0, len(job_ids), 100):
            jobs = await self._io(self.jobs.lookup_many, job_ids[start : start + 100])
            for job in jobs.values():
                if job.status is JobStatus.CANCELLED:
                    self.cancelled.add(job.job_id)
                    await self.engine.abort(job.job_id)
        # Renewed once a third of the lease has passed (not at every beat): it then never has less than about half
        # of it left while the holder lives, and a crashed holder's lapses no later than its messages' visibility.
        now = time.monotonic()
        due = [
            f
            for f in flights
            if f.job_id and f.leased and now - f.lease_renewed >= self.config.visibility_timeout_s / 3
        ]
        for flight in due:
            flight.lease_renewed = now
        leased = [f.job_id for f in due if f.job_id]
        for job_id in await self._io(self.jobs.renew_leases, self.owner, leased, self.config.visibility_timeout_s):
            job = await self._io(self.jobs.lookup, job_id)
            if job is not None and job.status is JobStatus.RUNNING and job.lease_owner != self.owner:
                logger.warning(
                    "job %s: another worker took it over (this heartbeat was late); aborting it here", job_id
                )
                self.lost.add(job_id)
                await self.engine.abort(job_id)
        if self.chunks is not None:
            await self.chunks.check_statuses()

    async def release(self, flights: list[InFlight]) -> None:
        """Let the leases of jobs handed back lapse now, so that the next worker starts them at once."""
        leased = [f.job_id for f in flights if f.job_id and f.leased]
        try:
            await self._io(self.jobs.renew_leases, self.owner, leased, 0)
        except Exception:  # they lapse by themselves within the visibility timeout
            logger.exception("could not release the leases of %d jobs handed back", len(leased))

    def forget(self, flight: InFlight) -> None:
        """The flight's message is settled."""
        if flight.job_id:
            self.cancelled.discard(flight.job_id)
            self.lost.discard(flight.job_id)

    # --- a batch chunk ----------------------------------------------------------------------------------------------

    async def _chunk(self, claim: ChunkClaimCheck, flight: InFlight) -> Outcome:
        if self.chunks is None:
            logger.error("chunk %s reached a worker without the batch lane; leaving it for redelivery", flight.ident)
            return self._retry(flight, "no batch lane")

        def entered() -> None:
            flight.in_engine = True

        done = await self.chunks.run(claim, receive_count=flight.message.receive_count, entered=entered)
        return Outcome.delete() if done else self._retry(flight, "chunk not stored")

    # --- a job ------------------------------------------------------------------------------------------------------

    async def _job(self, claim: ClaimCheck, flight: InFlight) -> Outcome:
        if utcnow() > claim.deadline:
            job = await self._io(self.jobs.lookup, claim.job_id)
            if job is not None and job.status is JobStatus.QUEUED:
                return await self._finish(flight, job, JobStatus.EXPIRED, error="still queued at its deadline")
        # Read while the job is still queued: the read overlaps the generation of the jobs in the engine.
        raw = await self._io(self.jobs.read_request, claim)
        endpoint = EMBEDDINGS_ENDPOINT if isinstance(claim, EmbeddingClaimCheck) else None
        request, reason = parse_request_body(raw, endpoint) if raw is not None else (None, MISSING_PAYLOAD)
        if request is None:
            # It never ran (attempts counts runs): failed from queued, or from running for a redelivery after a
            # crash, never from a final state.
            return await self._finish(
                flight, claim.job_id, JobStatus.FAILED, error=reason, only_from={JobStatus.QUEUED, JobStatus.RUNNING}
            )
        max_tokens = getattr(request, "max_tokens", 0)  # an embeddings request generates nothing
        if self.policy.refuses(max_tokens):
            # A newer deployment waits for this task: a job that could outlast the drain is the new tasks' to run. As
            # a new message: each refusal by an old task would otherwise count toward the dead-letter queue.
            return Outcome.requeue(self.config.visibility_timeout_s, "left to the newer deployment")
        if self.policy.is_long(max_tokens):
            flight.protect = True
            await self.policy.sync()

        job, outcome = await self._in_engine(claim, flight, request)
        if job is None:
            return await self._not_runnable(flight, claim.job_id)
        if job.job_id not in self.lost:  # a job taken over is streamed by its new holder
            await self.deltas.ended(job, outcome)
        if isinstance(outcome, asyncio.TimeoutError):
            await self.engine.abort(job.job_id)
            return await self._finish(
                flight, job, JobStatus.FAILED, error=f"execution timed out after {claim.timeout_s} s"
            )
        if isinstance(outcome, GenerationAborted):
            if job.job_id in self.lost:
                return Outcome.leave("lease lost")  # its new holder ends it; the message is not this worker's to end
            return Outcome.delete("cancelled")  # cancelled while running: the cancel stored the final state, notified
        if isinstance(outcome, PermanentEngineError):
            return await self._finish(flight, job, JobStatus.FAILED, error=str(outcome), error_code=outcome.code)
        if isinstance(outcome, TransientEngineError):
            logger.warning("job %s: transient engine fault (%s), leaving it for redelivery", job.job_id, outcome)
            return self._retry(flight, "transient engine fault")
        assert isinstance(outcome, (Generation, Embeddings))
        logger.debug("job %s generated in %.3f s", job.job_id, time.monotonic() - flight.started)
        result = answers.body(request, outcome, suffix=job.job_id.removeprefix("job_"), job_id=job.job_id)
        assert isinstance(result, JobResult)
        return await self._finish(flight, job, JobStatus.SUCCEEDED, result=result)

    async def _in_engine(
        self, claim: ClaimCheck, flight: InFlight, request: LineRequest
    ) -> tuple[Job | None, answers.Output | BaseException | None]:
        """Take the engine's slots (its rows), move the job to running (None if it may not run) and generate: the job
        and its generation or engine error, the slots freed before the result is stored, the timeout from the start."""
        flight.in_engine = True
        job: Job | None = None
        first = False  # a preempted job waits again at the head of its lane
        try:
            while True:
                async with self.admission.slot(
                    flight.lane, claim.job_id, first=first, tenant=claim.tenant, **answers.engine_cost(request)
                ) as slot:
                    if self.engine_dead is not None:
                        raise FatalEngineError(f"not started: the engine died ({self.engine_dead})")
                    if job is None:  # its first slot: it becomes running (once, however often it is preempted)
                        job = await self._start_running(claim, flight)
                        if job is None:
                            return None, None
                    if not slot.preempted:
                        self.progress.track(job)
                        self.deltas.track(job, request)
                        try:
                            if job.job_id in self.cancelled:
                                raise GenerationAborted(job.job_id)
                            generation = await asyncio.wait_for(
                                answers.run(self.engine, job.job_id, request), timeout=claim.timeout_s
                            )
                            return job, generation
                        except GenerationAborted as exc:
                            if not slot.preempted:  # cancelled, not preempted for an interactive job
                                return job, exc
                        except (TimeoutError, PermanentEngineError, TransientEngineError) as exc:
                            return job, exc
                        finally:
                            self.progress.forget(job.job_id)
                            self.deltas.forget(job.job_id)
                first = True  # preempted (gpu_worker.lanes): it runs again from the start
        finally:
            flight.in_engine = False

    async def _start_running(self, claim: ClaimCheck, flight: InFlight) -> Job | None:
        """Move the job to running as it takes its engine slot, and announce it; None when it may not run."""
        now = utcnow()
        job = await self._io(
            self.jobs.start,
            claim.job_id,
            started_at=now,
            progress=JobProgress(completion_tokens=0, updated_at=now),
            owner=self.owner,
            lease_s=self.config.visibility_timeout_s,
        )
        if job is None:
            return None
        flight.leased, flight.lease_renewed = True, time.monotonic()
        self.announcer.started(job)
        flight.started = time.monotonic()
        self.metrics.started((utcnow() - job.created_at).total_seconds())
        self.faults.at("before_engine", job.job_id)
        return job

    async def _finish(
        self,
        flight: InFlight,
        job: Job | str,
        target: JobStatus,
        *,
        result: JobResult | None = None,
        **fields: Any,
    ) -> Outcome:
        """End a job, succeeded or not, in the one order a crash can interrupt safely: result object (written once),
        final state, notification (batched). ``job`` is the job, or its id for one that never ran (a payload it
        cannot run with: a result needs the job)."""
        job_id = job if isinstance(job, str) else job.job_id
        processing_s = None
        if result is not None:
            assert isinstance(job, Job)
            generated_tokens = getattr(result.usage, "completion_tokens", 0)
            result, result_fields = await self._io(self.outcomes.store_result, job, result)
            processing_s = time.monotonic() - flight.started
            fields.update(result_fields)
            self.faults.at("after_result_write", job_id)
        finished = await self._io(self.outcomes.end, job, target, **fields)
        self.faults.at("after_state_write", job_id)
        if finished is None:
            # Cancelled meanwhile, or another run of the job finished first. The message is done with only once that
            # end was notified: if the other run died before publishing, this message is the one left to do it.
            return await self._not_runnable(flight, job_id)
        if target is JobStatus.SUCCEEDED and processing_s is not None:
            self.metrics.succeeded(processing_s=processing_s, completion_tokens=generated_tokens)
        elif target is JobStatus.FAILED:
            self.metrics.failed()
        if not await self.announcer.finished(finished, result):
            # The job is final but its notification did not go out: leave the message, and its redelivery finds the
            # job final and not notified, and sends it.
            return self._retry(flight, "notification not published")
        if target is JobStatus.SUCCEEDED:
            self.jobs_finished += 1
        return Outcome.delete(target.value)

    async def _not_runnable(self, flight: InFlight, job_id: str) -> Outcome:
        """The job could not be moved to running (or ended): find out why, and whether the message is done with."""
        job = await self._io(self.jobs.lookup, job_id)
        if job is None:
            logger.error("claim check for unknown job %s; deleting it", job_id)
            return Outcome.delete("unknown job")
        if job.status in FINAL_STATES:
            if job.notified:
                return Outcome.delete("final")
            # Final but not notified: either its finisher crashed between the state write and the publish, or it is
            # publishing right now (a duplicate delivery of the same message). Only the first needs us; the finisher
            # would have published within its visibility timeout, so until then look again later.
            finished_at = job.finished_at or job.updated_at
            if (utcnow() - finished_at).total_seconds() < self.config.visibility_timeout_s:
                return self._retry(flight, "final, notification pending")
            await self._io(self.outcomes.notify, job)
            return Outcome.delete("final, notified")
        if job.status is JobStatus.RUNNING and job.lease_owner not in (None, self.owner):
            return _held_elsewhere(job, self.config.visibility_timeout_s)
        return self._retry(flight, f"job {job.status.value}")  # e.g. still awaiting its upload: try again later


def _held_elsewhere(job: Job, visibility: int) -> Outcome:
    """A copy of the claim check of a job another worker runs: look again once its lease may have lapsed."""
    now_ms = utcnow().timestamp() * 1000
    left_s = max(0.0, ((job.lease_expires_ms or 0) - now_ms) / 1000)
    if left_s <= visibility / 4:
        # A lease a live holder would have renewed by now: its holder is gone (its message is coming back), so
        # look again just after the lease lapses, and take the job over then.
        return Outcome.retry(math.ceil(left_s) + 1, "lease lapsing")
    # A live holder: hide the copy until the run would have timed out, so that it costs one receive per run.
    started = job.started_at or utcnow()
    until_s = (started - utcnow()).total_seconds() + job.timeout_s + visibility
    logger.info("job %s runs on %s; its copy comes back in %.0f s", job.job_id, job.lease_owner, until_s)
    hidden_s = min(SQS_MAX_VISIBILITY_S, max(math.ceil(left_s) + 1, math.ceil(until_s)))
    return Outcome.retry(hidden_s, "held elsewhere")
