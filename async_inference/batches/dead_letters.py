"""Chunk claim checks that exhausted their receives on the batch lane: their lines become error lines and the chunk is
counted, so the batch still finalizes (docs/design/batches.md, "When a chunk keeps failing").

A chunk reaches the lane's DLQ when workers failed it ``settings.MAX_RECEIVE_COUNT`` times (an infrastructure fault
each time, or a worker that died holding it). Nothing more is run: each of its lines becomes an error line with
``error.code`` ``DEAD_LETTERED_CODE``, written as the worker writes a chunk's lines (the output part, the error part,
then ``BatchStore.record_chunk``, counted once; ``BatchControl(kind="finalize")`` when it was the last chunk). What a
worker had stored already stands: a chunk whose results object was written before the failures (a worker that died
between the results and the parts) keeps those results, so no line that ran is reported as not run.

A line of a cancelled batch goes in neither part, as the worker leaves a cancelled chunk's unfinished lines.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pydantic import ValidationError

from async_inference import settings
from async_inference.aws import Blobs, ControlQueue
from async_inference.batches.lines import line_id
from async_inference.batches.models import BatchStatus
from async_inference.batches.store import BatchStore
from async_inference.schemas import BatchControl, BatchLineError, BatchLineOutput, ChunkClaimCheck

logger = logging.getLogger(__name__)

DEAD_LETTERED_CODE = "chunk_dead_lettered"
# The worker's bound on one chunk's results object (gpu_worker.chunks.MAX_RESULTS_BYTES).
MAX_RESULTS_BYTES = 256 * 1024 * 1024
JSONL = "application/jsonl"
# Batches whose chunks are still to be counted; the others were finalized (or are being finalized) already.
COUNTING = frozenset({BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING})


def is_chunk_message(body: str) -> bool:
    """Whether a dead-lettered message is a chunk claim check (the lane also carries single jobs' claim checks)."""
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("kind") == "batch_chunk"


@dataclass(frozen=True)
class ChunkEnded:
    """What became of a dead-lettered chunk: counted now (False: its batch is gone, final, or it was counted before),
    its lines in each part, and whether its batch was sent to finalize."""

    counted: bool
    completed: int = 0
    failed: int = 0
    finalize_sent: bool = False


class ChunkDeadLetters:
    """Ends dead-lettered chunks: error lines, the count, the finalize step."""

    def __init__(self, *, store: BatchStore, blobs: Blobs, control: ControlQueue) -> None:
        self.store = store
        self.blobs = blobs
        self.control = control

    def end(self, body: str, receive_count: int) -> ChunkEnded:
        """End the chunk ``body`` names (ValueError when it is not a chunk claim check)."""
        try:
            claim = ChunkClaimCheck.model_validate_json(body)
        except ValidationError as exc:
            raise ValueError(f"not a chunk claim check: {exc.errors(include_url=False)[0]['msg']}") from exc
        record = self.store.get_batch(claim.batch_id)
        if record is None or record.status not in COUNTING:
            return ChunkEnded(counted=False)
        if claim.chunk in record.counted_chunks:
            # Counted by a worker after all (its count landed, its delete did not): finalize may still be owed.
            return ChunkEnded(counted=False, finalize_sent=self._finalize_if_done(claim, record.all_counted))
        lines = self._stored_results(claim)
        if lines is None:
            lines = [] if record.status is BatchStatus.CANCELLING else self._error_lines(claim, receive_count)
        outputs = [line for line in lines if _is_output(line)]
        errors = [line for line in lines if not _is_output(line)]
        for kind, part in (("output", outputs), ("error", errors)):
            key = settings.batch_part_key(claim.tenant, claim.batch_id, claim.chunk, kind)
            # Written once: parts a worker wrote before it failed stand (they came from the same results).
            self.blobs.put_json_once(
                key, _encode(part), bucket=claim.bucket, content_type=JSONL, max_bytes=MAX_RESULTS_BYTES
            )
        recorded = self.store.record_chunk(claim.batch_id, claim.chunk, completed=len(outputs), failed=len(errors))
        logger.warning(
            "batch %s chunk %d dead-lettered after %d receives: %d error lines",
            claim.batch_id,
            claim.chunk,
            receive_count,
            len(errors),
        )
        return ChunkEnded(
            counted=recorded.counted,
            completed=len(outputs),
            failed=len(errors),
            finalize_sent=self._finalize_if_done(claim, recorded.all_counted),
        )

    def _finalize_if_done(self, claim: ChunkClaimCheck, all_counted: bool) -> bool:
        if all_counted:
            self.control.send(BatchControl(kind="finalize", batch_id=claim.batch_id, tenant=claim.tenant))
        return all_counted

    def _stored_results(self, claim: ChunkClaimCheck) -> list[BatchLineOutput] | None:
        key = settings.batch_results_key(claim.tenant, claim.batch_id, claim.chunk)
        try:
            data = self.blobs.get(key, max_bytes=MAX_RESULTS_BYTES, bucket=claim.bucket)
        except KeyError:
            return None
        return [BatchLineOutput.model_validate_json(line) for line in data.splitlines() if line.strip()]

    def _error_lines(self, claim: ChunkClaimCheck, receive_count: int) -> list[BatchLineOutput]:
        """One error line per input line of the chunk's byte range, named by its custom_id."""
        data = self.blobs.get_range(claim.input_key, claim.start_byte, claim.end_byte, bucket=claim.bucket)
        message = (
            f"this request was not run: the chunk of {claim.line_count} lines holding it failed in the workers "
            f"{receive_count} times and was dead-lettered"
        )
        lines = []
        for offset, raw in enumerate(line for line in data.split(b"\n") if line.strip()):
            number = claim.first_line + offset
            try:
                custom_id = str(json.loads(raw)["custom_id"])
            except (ValueError, KeyError, TypeError):
                custom_id = f"line-{number}"  # as the worker names a line it cannot read
            lines.append(
                BatchLineOutput(
                    id=line_id(claim.batch_id, custom_id),
                    custom_id=custom_id,
                    error=BatchLineError(code=DEAD_LETTERED_CODE, message=message),
                )
            )
        return lines


def _is_output(line: BatchLineOutput) -> bool:
    return line.error is None and line.response is not None and line.response.status_code == 200


def _encode(lines: list[BatchLineOutput]) -> bytes:
    return b"".join(line.model_dump_json().encode() + b"\n" for line in lines)
