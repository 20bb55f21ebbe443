"""Interactive jobs go ahead of batch lines: a job that reaches a worker busy with a batch starts within one engine
step, whether a reserved slot is free or a batch line must be preempted for it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from async_inference.fleets import ANY_MODEL, FleetRoute
from async_inference.jobs_service import JobService
from async_inference.schemas import ChatCompletionRequest, JobSubmission
from gpu_worker.engines.base import Generation
from gpu_worker.engines.simulated import SimulatedEngine
from tests.batchworker.conftest import BatchStack, body, input_line
from tests.faults.fault_stack import TENANT, chat, wait_until

pytestmark = pytest.mark.e2e
STEP_S = 0.02
LINE_TOKENS = 4000
LINE_S = LINE_TOKENS * STEP_S  # a batch line's generation: 80 s


class Stepped(SimulatedEngine):
    """The simulated engine, recording for each request the engine step (and wall time) its generate began and
    ended at, and every request it was asked to generate, in order."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.asked: list[str] = []
        self.began: dict[str, tuple[int, float]] = {}
        self.ended: dict[str, int] = {}
        self.generating = 0

    async def generate(self, request_id: str, request: ChatCompletionRequest) -> Generation:
        self.asked.append(request_id)
        self.began[request_id] = (self.stats.steps, time.time())
        self.generating += 1
        try:
            generation = await super().generate(request_id, request)
        finally:
            self.generating -= 1
        self.ended[request_id] = self.stats.steps
        return generation


@pytest.mark.parametrize("reserve", [0, 1])
def test_an_interactive_job_overtakes_a_batch_that_keeps_the_engine_busy(batches: BatchStack, reserve: int):
    # GIVEN a worker whose engine is kept busy by a batch: 60 lines of 4000 tokens (80 s each) for 8 slots
    batch = batches.submit(
        [input_line(f"long-{i}", body("x " * LINE_TOKENS, max_tokens=LINE_TOKENS)) for i in range(60)]
    )
    engine = Stepped(capacity=8, step_s=STEP_S)
    with batches.worker(engine, interactive_reserve=reserve) as worker:
        wait_until(lambda: engine.generating == 8 - reserve, 30, "the batch to fill the engine")
        # WHEN an interactive job is submitted while the batch runs
        job_id = batches.fstack.api().submit(chat("one two three", max_tokens=3)).job_id
        job = batches.fstack.wait_final([job_id], timeout_s=30)[job_id]
        still_running = engine.generating
        preemptions = worker.admission.preemptions
    # THEN it succeeded while the batch lines were still generating
    assert job.status.value == "succeeded"
    assert still_running >= 8 - reserve - 1
    # AND the worker sent it to the engine once it held it (its payload read away from its running state), not after a
    # batch line's 80 s (a bound of an eighth of that: a loaded host's S3 read took 2.4 s), and it generated in its own
    # 3 steps plus at most one to enter the batch: nothing of the batch queued ahead of it
    assert job.started_at is not None
    began_step, began_at = engine.began[job_id]
    assert began_at - job.started_at.timestamp() < LINE_S / 8
    assert engine.ended[job_id] - began_step <= 3 + 2
    # AND a free reserved slot took it without aborting anything; with no reserve, one batch line was preempted
    assert preemptions == (1 if reserve == 0 else 0)
    assert batches.record(batch).counted_chunks == set()


def test_a_batch_priority_job_preempted_for_an_interactive_one_runs_again_to_its_end(batches: BatchStack):
    # GIVEN a single job submitted with batch priority (its claim check on the batch lane), alone in a 1-slot engine
    service = JobService.from_config(batches.config)
    lane = {ANY_MODEL: FleetRoute(queue_url=batches.batch_queue_url)}  # its job on the batch lane, as a batch job's
    service = JobService(store=service.store, blobs=service.blobs, notifier=service.notifier, fleets=lane)
    prompt = " ".join(f"w{i}" for i in range(150))  # 150 tokens: 3 s
    request = ChatCompletionRequest(model="echo-model", messages=[{"role": "user", "content": prompt}], max_tokens=150)
    batch_job = service.api.submit(TENANT, JobSubmission(request=request), None).job.job_id
    engine = Stepped(capacity=1, step_s=STEP_S)
    with batches.worker(engine, interactive_reserve=0) as worker:
        wait_until(lambda: engine.generating == 1, 30, "the batch-priority job to start")
        # WHEN an interactive job arrives
        job_id = batches.fstack.api().submit(chat("one two three", max_tokens=3)).job_id
        jobs = batches.fstack.wait_final([job_id, batch_job], timeout_s=60)
        preemptions = worker.admission.preemptions
    # THEN the interactive job finished first, the batch job was preempted once and run again from the start
    assert {j.status.value for j in jobs.values()} == {"succeeded"}
    assert jobs[job_id].finished_at < jobs[batch_job].finished_at
    assert preemptions == 1
    assert engine.asked.count(batch_job) == 2 and engine.asked.index(job_id) == 1
    # AND its result is the whole generation
    result = batches.fstack.result_objects(batch_job)
    assert len(result) == 1 and result[0]["choices"][0]["message"]["content"] == prompt
    assert result[0]["usage"]["completion_tokens"] == 150
