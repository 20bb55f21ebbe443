"""A batch cancelled or past its completion window while its chunks run: finished lines stay, the rest stop."""

from __future__ import annotations

import time
from typing import Any

import pytest

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.chunks import line_id
from gpu_worker.engines.base import Generation
from gpu_worker.engines.simulated import SimulatedEngine
from tests.batchworker.conftest import BatchStack, body, input_line
from tests.faults.fault_stack import TENANT

pytestmark = pytest.mark.e2e
STEP_S = 0.02
LONG = 4000  # tokens (MAX_TOKENS_LIMIT is 4096): 80 s at STEP_S, far longer than any test waits


class Counting(SimulatedEngine):
    """The simulated engine, remembering which requests it was asked to generate."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.asked: list[str] = []

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        self.asked.append(request_id)
        return await super().generate(request_id, request)


def mixed(short: int, long: int, prefix: str = "") -> list[bytes]:
    """``short`` lines of 2 tokens, then ``long`` lines of LONG tokens (the simulated engine answers with as many
    tokens as the prompt has words, up to max_tokens)."""
    return [input_line(f"{prefix}short-{i}", body("a b", max_tokens=2)) for i in range(short)] + [
        input_line(f"{prefix}long-{i}", body("x " * LONG, max_tokens=LONG)) for i in range(long)
    ]


def wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def test_cancel_aborts_running_lines_keeps_finished_ones_and_skips_queued_chunks(batches: BatchStack):
    # GIVEN a batch whose first chunk has 20 short lines then 80 long ones, and a second chunk still queued behind it
    batch = batches.submit(mixed(20, 80) + mixed(0, 30, prefix="queued-"))
    assert batch.chunks == 2
    engine = Counting(capacity=16, step_s=STEP_S, output_tokens=None)
    with batches.worker(engine) as worker:
        wait(lambda: engine.stats.completed >= 20 and len(engine.asked) > 20, 30, "the short lines to finish")
        # WHEN the batch is cancelled through the API while its long lines run
        cancelled_at = time.monotonic()
        assert batches.service.cancel_batch(TENANT, batch.batch_id).status == "cancelling"
        wait(lambda: batches.record(batch).all_counted, 30, "every chunk to be counted")
        stopped_s = time.monotonic() - cancelled_at
        assert worker.chunks is not None
    # THEN the controller ended it cancelled: the finished lines are in its output file, and no unfinished line is in
    # either file (as OpenAI leaves them)
    record = batches.wait_final(batch, timeout_s=30)
    assert record.status.value == "cancelled"
    outputs, errors = batches.files(record)
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"short-{i}" for i in range(20))
    assert errors == [] and record.error_file_id is None
    # AND the running long lines were aborted in the engine, within a few heartbeats rather than their 80 s
    assert engine.stats.aborted >= 1 and engine.stats.completed == 20
    assert stopped_s < 20
    # AND the queued chunk ran nothing: its parts are written empty and it is counted, so the last count finalizes
    assert batches.part(batch, 1, "output") == [] and batches.part(batch, 1, "error") == []
    assert {line_id(batch.batch_id, f"queued-long-{i}") for i in range(30)}.isdisjoint(engine.asked)
    assert (record.completed, record.failed, record.counted_chunks) == (20, 0, {0, 1})


def test_lines_not_finished_by_the_completion_window_are_batch_expired_error_lines(batches: BatchStack):
    # GIVEN a batch whose completion window ends 5 s after its creation: 10 short lines, and 10 lines that need 80 s
    batch = batches.submit(mixed(10, 10), completion_window_s=5)
    engine = Counting(capacity=32, step_s=STEP_S)
    # WHEN a worker runs it past the deadline
    with batches.worker(engine):
        record = batches.wait_final(batch, timeout_s=30)
    # THEN the controller ended it expired: the short lines are in its output file, and each long one is an error
    # line with code batch_expired
    assert record.status.value == "expired"
    outputs, errors = batches.files(record)
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"short-{i}" for i in range(10))
    assert sorted(line["custom_id"] for line in errors) == sorted(f"long-{i}" for i in range(10))
    assert {(line["error"]["code"], line["response"] is None) for line in errors} == {("batch_expired", True)}
    # AND they left the engine at the deadline instead of generating on for their 80 s
    assert engine.stats.tokens < 10 * LONG // 4
    assert (record.completed, record.failed) == (10, 10)


def test_a_chunk_received_after_its_deadline_expires_every_line_without_the_engine(batches: BatchStack):
    # GIVEN a batch whose completion window is already over when a worker receives its chunk
    batch = batches.submit(mixed(5, 0), completion_window_s=0)
    engine = Counting(capacity=8, step_s=STEP_S)
    # WHEN a worker takes it
    with batches.worker(engine):
        record = batches.wait_final(batch, timeout_s=30)
    # THEN every line is batch_expired, the engine was never asked, and the batch has no output file
    assert record.status.value == "expired"
    outputs, errors = batches.files(record)
    assert outputs == [] and record.output_file_id is None
    assert [line["error"]["code"] for line in errors] == ["batch_expired"] * 5
    assert engine.asked == []
