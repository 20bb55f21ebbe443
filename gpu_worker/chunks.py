"""Running one chunk of a batch: a range of its input file's lines, fed into the engine beside interactive jobs.

A chunk claim check (``ChunkClaimCheck``) names a byte range of the input file. The worker reads it (one ranged
GetObject), runs each line as a batch-lane engine request (``gpu_worker.lanes``), and stores the chunk's lines in the
order a crash can interrupt safely (docs/design/batches.md):

1. the chunk's results object (``settings.batch_results_key``: every line, output and error together), written once;
2. the output part and the error part (``settings.batch_part_key``), each written once, both cut from the results
   object that stands: a redelivered chunk whose first run stored its results reuses them rather than running again,
   so the two parts always come from one run and each ``custom_id`` is in exactly one of them;
3. ``BatchStore.record_chunk`` (counted once); when it says every chunk is counted, ``BatchControl(kind="finalize")``
   to the control queue. Then the worker deletes the message.

What a line becomes (OpenAI's line format, ``BatchLineOutput``):

* generated: ``response.status_code`` 200 with OpenAI's answer for the line's url (``gpu_worker.answers``): a
  chat.completion, an embedding list (output part);
* a body the request schema refuses: 400 with the message the jobs API gives (``describe_validation_error``); a
  model this worker does not serve: 404 ``model_not_found`` (error part);
* not finished by the batch's deadline (``completion_window``): ``error.code`` ``batch_expired``; over the line's
  execution timeout: ``request_timeout``; refused by the engine (prompt too long): 400 (error part);
* its batch cancelled: a line not finished is in neither part (as OpenAI leaves it); finished lines stay.

Requests a chunk costs, whatever its size: a status read, a ranged read, three writes, the count, the delete, its
share of the receive and of the heartbeat's visibility extensions and status reads (one per 100 batches), and one
finalize send per batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from async_inference import settings
from async_inference.aws import Blobs, ControlQueue
from async_inference.batches.lines import BatchInputLine, line_id
from async_inference.endpoints import LineRequest, request_name
from async_inference.jobs_service import describe_validation_error
from async_inference.schemas import (
    BatchControl,
    BatchLineError,
    BatchLineOutput,
    BatchLineResponse,
    ChunkClaimCheck,
    utcnow,
)
from async_inference.served_models import ServedModels
from gpu_worker import answers
from gpu_worker.engines.base import (
    Engine,
    GenerationAborted,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.faults import Faults
from gpu_worker.lanes import BATCH, Admission

logger = logging.getLogger("gpu_worker.chunks")
T = TypeVar("T")

# Batch statuses (OpenAI's names) as the worker acts on them. A chunk exists only once its batch's plan is recorded,
# and the controller may send the chunks before it moves the batch from validating to in_progress (a crash between
# the two sends them again): a chunk of a validating batch runs.
RUNS = frozenset({"validating", "in_progress"})
CANCELS = frozenset({"cancelling", "cancelled"})
EXPIRES = frozenset({"expired"})
CANCEL, EXPIRE = "cancel", "expire"
# A transient engine fault on a line is retried in place this many times before the line is an error line: one line
# must not send its whole chunk (and every finished line in it) back to the queue.
LINE_ATTEMPTS = settings.MAX_RECEIVE_COUNT
# A chunk's results object: BATCH_CHUNK_LINES lines of at most MAX_TOKENS_LIMIT tokens each stay far below this.
MAX_RESULTS_BYTES = 256 * 1024 * 1024
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
JSONL = "application/jsonl"


class ChunkRecorded(Protocol):
    """What ``BatchStore.record_chunk`` returns (the attributes the worker reads)."""

    all_counted: bool  # every chunk of the batch is counted now: finalize it


class BatchLedger(Protocol):
    """The two methods of ``BatchStore`` (async_inference/batches/store.py) the worker calls."""

    def statuses(self, batch_ids: Iterable[str]) -> Mapping[str, Any]:
        """Current status of up to 100 batches in one request (missing ids: no such batch)."""

    def record_chunk(self, batch_id: str, chunk: int, *, completed: int, failed: int) -> ChunkRecorded:
        """Count one chunk's lines, once."""


def status_name(status: Any) -> str | None:
    """A batch status as its string (``BatchStatus`` members and plain strings alike)."""
    return None if status is None else str(getattr(status, "value", status))


# --- lines ----------------------------------------------------------------------------------------------------------


@dataclass
class ChunkLine:
    """One input line of a chunk: its ids, and either the request to run or the result it has without the engine."""

    number: int  # line number in the input file (1-based)
    custom_id: str
    line_id: str  # batch_req_...: the output line's id and the engine's request id (the same on every run)
    request: LineRequest | None = None
    result: BatchLineOutput | None = None


def request_id(line: ChunkLine) -> str:
    return "req_" + line.line_id.removeprefix("batch_req_")


def refused(line: ChunkLine, status_code: int, message: str, *, code: str, param: str | None = None) -> BatchLineOutput:
    """An error line with a response, as the API would have answered the request (OpenAI's error object)."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return BatchLineOutput(
        id=line.line_id,
        custom_id=line.custom_id,
        response=BatchLineResponse(status_code=status_code, request_id=request_id(line), body={"error": error}),
    )


def failed(line: ChunkLine, code: str, message: str) -> BatchLineOutput:
    """An error line without a response: the request never got one (expired, timed out)."""
    return BatchLineOutput(id=line.line_id, custom_id=line.custom_id, error=BatchLineError(code=code, message=message))


def expired(line: ChunkLine) -> BatchLineOutput:
    return failed(line, "batch_expired", EXPIRED_MESSAGE)


def succeeded(line: ChunkLine, output: answers.Output) -> BatchLineOutput:
    assert line.request is not None
    answer = answers.body(line.request, output, suffix=line.line_id.removeprefix("batch_req_"))
    return BatchLineOutput(
        id=line.line_id,
        custom_id=line.custom_id,
        response=BatchLineResponse(
            status_code=200, request_id=request_id(line), body=answer.model_dump(mode="json", exclude={"job_id"})
        ),
    )


def is_output(line: BatchLineOutput) -> bool:
    """Whether a line belongs to the output part (a 200 response); every other line is an error line."""
    return line.error is None and line.response is not None and line.response.status_code == 200


def parse_lines(claim: ChunkClaimCheck, data: bytes, served: ServedModels) -> list[ChunkLine]:
    """The chunk's lines from its byte range. The controller checked the structure (JSON, custom_id, url, method);
    bodies are checked here, line by line, with the request schema the jobs API uses."""
    lines: list[ChunkLine] = []
    for offset, raw in enumerate(line for line in data.split(b"\n") if line.strip()):
        number = claim.first_line + offset
        try:
            item = BatchInputLine.model_validate_json(raw)
        except ValidationError:
            # Only a file changed after planning gets here: the line still gets a result, so that it is not lost.
            unknown = f"line-{number}"
            line = ChunkLine(number=number, custom_id=unknown, line_id=line_id(claim.batch_id, unknown))
            line.result = failed(
                line, "invalid_line", f"line {number} is not a batch input line (custom_id, method, url, body)"
            )
            lines.append(line)
            continue
        line = ChunkLine(number=number, custom_id=item.custom_id, line_id=line_id(claim.batch_id, item.custom_id))
        try:
            request = item.request()
        except ValidationError as exc:
            message, details = describe_validation_error(exc)
            line.result = refused(
                line,
                400,
                f"the body is not a valid {request_name(item.url)} request: {message}",
                code="invalid_request",
                param=details[0]["field"] if details else None,
            )
        else:
            if not served.serves(request.model):
                # The jobs API's check and message (async_inference.served_models), as a line's 404.
                line.result = refused(
                    line, 404, served.not_found_message(request.model), code="model_not_found", param="model"
                )
            else:
                line.request = request
        lines.append(line)
    if len(lines) != claim.line_count:
        logger.warning(
            "batch %s chunk %d: %d lines in its byte range, %d planned",
            claim.batch_id,
            claim.chunk,
            len(lines),
            claim.line_count,
        )
    return lines


def encode(lines: Iterable[BatchLineOutput]) -> bytes:
    return b"".join(line.model_dump_json().encode() + b"\n" for line in lines)


def decode(data: bytes) -> list[BatchLineOutput]:
    return [BatchLineOutput.model_validate_json(line) for line in data.splitlines() if line.strip()]


# --- one chunk's run ------------------------------------------------------------------------------------------------


@dataclass
class ChunkRun:
    """The lines of one chunk while they run; ``stop`` cancels or expires what has not finished."""

    claim: ChunkClaimCheck
    lines: list[ChunkLine]
    engine: Engine
    admission: Admission
    faults: Faults
    retry_delay_s: Callable[[int], float]
    stopped: str | None = None  # CANCEL or EXPIRE, once the batch was seen cancelled or expired
    running: set[str] = field(default_factory=set)  # line ids inside the engine
    tasks: dict[str, asyncio.Task[BatchLineOutput | None]] = field(default_factory=dict)
    finished: int = 0

    @property
    def ident(self) -> str:
        return f"{self.claim.batch_id}/{self.claim.chunk}"

    def left_s(self) -> float:
        return (self.claim.deadline - utcnow()).total_seconds()

    async def execute(self) -> list[BatchLineOutput]:
        """Every line's result in input order; lines of a cancelled batch that did not finish are left out."""
        for line in self.lines:
            if line.result is None:
                self.tasks[line.line_id] = asyncio.create_task(self._line(line))
        try:
            results = dict(zip(self.tasks, await asyncio.gather(*self.tasks.values()), strict=False))
        except BaseException:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)
            raise
        outputs = [line.result if line.result is not None else results[line.line_id] for line in self.lines]
        return [output for output in outputs if output is not None]

    async def stop(self, reason: str) -> None:
        """The batch was cancelled (``CANCEL``) or expired (``EXPIRE``): abort running lines, end waiting ones."""
        if self.stopped is not None:
            return
        self.stopped = reason
        logger.info(
            "batch %s chunk %d: %s; stopping %d lines",
            self.claim.batch_id,
            self.claim.chunk,
            "cancelled" if reason == CANCEL else "expired",
            sum(not t.done() for t in self.tasks.values()),
        )
        for running_id, task in self.tasks.items():
            if running_id in self.running:
                await self.engine.abort(running_id)
            elif not task.done():
                task.cancel()

    def _stopped_result(self, line: ChunkLine) -> BatchLineOutput | None:
        return None if self.stopped == CANCEL else expired(line)

    async def _line(self, line: ChunkLine) -> BatchLineOutput | None:
        try:
            return await self._run_line(line)
        except asyncio.CancelledError:
            if self.stopped is None:
                raise  # the chunk itself is being cancelled (drain, a sibling's fatal engine error)
            return self._stopped_result(line)

    async def _run_line(self, line: ChunkLine) -> BatchLineOutput | None:
        assert line.request is not None
        attempt, first = 0, False
        while True:
            if self.stopped is not None:
                return self._stopped_result(line)
            left = self.left_s()
            if left <= 0:
                return expired(line)
            retry_in: float | None = None
            window = asyncio.timeout(left)
            try:
                async with window:
                    cost = answers.engine_cost(line.request)
                    async with self.admission.slot(
                        BATCH, line.line_id, first=first, tenant=self.claim.tenant, **cost
                    ) as slot:
                        if self.stopped is not None or slot.preempted:
                            first = True
                            continue
                        self.running.add(line.line_id)
                        try:
                            output = await asyncio.wait_for(
                                answers.run(self.engine, line.line_id, line.request), timeout=self.claim.timeout_s
                            )
                        except GenerationAborted:
                            if self.stopped is None and not slot.preempted:
                                raise
                            first = True  # preempted: ask again at the head of the lane; stopped: the loop ends it
                            continue
                        except TimeoutError:
                            await self.engine.abort(line.line_id)
                            return failed(
                                line, "request_timeout", f"execution timed out after {self.claim.timeout_s} s"
                            )
                        except PermanentEngineError as exc:
                            return refused(line, 400, str(exc), code="invalid_request")
                        except TransientEngineError as exc:
                            attempt += 1
                            if attempt >= LINE_ATTEMPTS:
                                return failed(line, "engine_unavailable", f"{exc} (after {attempt} attempts)")
                            retry_in = self.retry_delay_s(attempt)
                        finally:
                            self.running.discard(line.line_id)
                    if retry_in is None:
                        self.finished += 1
                        if self.finished == 1:
                            self.faults.at("in_chunk", self.ident)
                        return succeeded(line, output)
                    await asyncio.sleep(retry_in)
            except TimeoutError:
                if not window.expired():
                    raise
                await self.engine.abort(line.line_id)
                return expired(line)


# --- the worker's chunks --------------------------------------------------------------------------------------------


class Chunks:
    """Runs chunk claim checks for a worker, and checks the statuses of the batches it holds chunks of."""

    def __init__(
        self,
        *,
        engine: Engine,
        admission: Admission,
        blobs: Blobs,
        ledger: BatchLedger,
        control: ControlQueue,
        io: Callable[..., Awaitable[Any]],
        faults: Faults,
        retry_delay_s: Callable[[int], float],
        served_models: ServedModels | None = None,
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.blobs = blobs
        self.ledger = ledger
        self.control = control
        self._io = io
        self.faults = faults
        self.retry_delay_s = retry_delay_s
        self.served_models = served_models or ServedModels.of(None)
        self.runs: dict[str, ChunkRun] = {}  # by ident, while their lines run
        self.chunks_started = 0
        self.chunks_done = 0
        self.finalizes_sent = 0

    async def run(
        self, claim: ChunkClaimCheck, *, receive_count: int = 1, entered: Callable[[], None] = lambda: None
    ) -> bool:
        """Run a chunk to its recorded count; True when the message is done with, False to leave it for redelivery.
        ``entered`` is called once the chunk's lines wait for engine slots (or need none)."""
        ident = f"{claim.batch_id}/{claim.chunk}"
        self.chunks_started += 1
        status = status_name((await self._io(self.ledger.statuses, [claim.batch_id])).get(claim.batch_id))
        if status is None:
            logger.error("chunk %s: no batch %s; deleting the message", ident, claim.batch_id)
            return True
        if status not in RUNS | CANCELS | EXPIRES:
            # finalizing, completed, failed: every chunk was counted already; this is a late redelivery.
            logger.info("chunk %s: batch already %s; nothing to run", ident, status)
            return True
        mode = CANCEL if status in CANCELS else EXPIRE if status in EXPIRES else None
        results_key = settings.batch_results_key(claim.tenant, claim.batch_id, claim.chunk)
        body = await self._stored_results(results_key, claim.bucket) if receive_count > 1 else None
        if body is None:
            outputs = await self._outputs(claim, mode, entered)
            body = encode(outputs)
            stood = await self._io(
                self.blobs.put_json_once,
                results_key,
                body,
                bucket=claim.bucket,
                content_type=JSONL,
                max_bytes=MAX_RESULTS_BYTES,
            )
            if stood is not None:
                body = stood  # another run of this chunk stored its results first: they stand
            self.faults.at("after_chunk_results", ident)
        else:
            entered()
            logger.info("chunk %s: redelivered after its results were stored; reusing them", ident)
        await self._store_parts(claim, decode(body))
        return True

    async def _stored_results(self, key: str, bucket: str) -> bytes | None:
        try:
            return await self._io(self.blobs.get, key, max_bytes=MAX_RESULTS_BYTES, bucket=bucket)
        except KeyError:
            return None

    async def _outputs(
        self, claim: ChunkClaimCheck, mode: str | None, entered: Callable[[], None]
    ) -> list[BatchLineOutput]:
        if mode == CANCEL:
            entered()
            return []  # cancelled before it ran: its lines are in neither part
        data = await self._io(
            self.blobs.get_range, claim.input_key, claim.start_byte, claim.end_byte, bucket=claim.bucket
        )
        lines = parse_lines(claim, data, self.served_models)
        if mode == EXPIRE or utcnow() >= claim.deadline:
            entered()
            return [line.result or expired(line) for line in lines]
        run = ChunkRun(claim, lines, self.engine, self.admission, self.faults, self.retry_delay_s)
        self.runs[run.ident] = run
        try:
            entered()
            return await run.execute()
        finally:
            self.runs.pop(run.ident, None)

    async def _store_parts(self, claim: ChunkClaimCheck, lines: list[BatchLineOutput]) -> None:
        ident = f"{claim.batch_id}/{claim.chunk}"
        outputs = [line for line in lines if is_output(line)]
        errors = [line for line in lines if not is_output(line)]
        for kind, part in (("output", outputs), ("error", errors)):
            key = settings.batch_part_key(claim.tenant, claim.batch_id, claim.chunk, kind)
            # Cut from the results that stand, so a part written by an earlier run has the same bytes.
            await self._io(
                self.blobs.put_json_once,
                key,
                encode(part),
                bucket=claim.bucket,
                content_type=JSONL,
                max_bytes=MAX_RESULTS_BYTES,
            )
            if kind == "output":
                self.faults.at("between_parts", ident)
        recorded = await self._io(
            self.ledger.record_chunk, claim.batch_id, claim.chunk, completed=len(outputs), failed=len(errors)
        )
        self.faults.at("after_chunk_recorded", ident)
        if recorded.all_counted:
            # Also sent by a redelivery that finds every chunk counted: a crash may have come before this send, and
            # finalize is idempotent.
            await self._io(
                self.control.send, BatchControl(kind="finalize", batch_id=claim.batch_id, tenant=claim.tenant)
            )
            self.finalizes_sent += 1
        self.chunks_done += 1

    async def check_statuses(self) -> None:
        """The heartbeat's look at the batches whose chunks run here (one request per 100 batches): cancelled ones
        have their lines stopped, expired ones their unfinished lines expired."""
        batch_ids = sorted({run.claim.batch_id for run in self.runs.values()})
        for start in range(0, len(batch_ids), 100):
            statuses = await self._io(self.ledger.statuses, batch_ids[start : start + 100])
            for run in list(self.runs.values()):
                status = status_name(statuses.get(run.claim.batch_id))
                if status in CANCELS:
                    await run.stop(CANCEL)
                elif status in EXPIRES:
                    await run.stop(EXPIRE)
