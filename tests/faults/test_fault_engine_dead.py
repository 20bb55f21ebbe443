"""A dead engine (vLLM's EngineDeadError, a CUDA fault) ends the worker process, not the jobs: they go back to the queue
unfailed, and the process that replaces it runs them."""

from __future__ import annotations

import time
from pathlib import Path

from gpu_worker.worker import EXIT_ENGINE_DEAD
from tests.faults.fault_stack import FaultStack, Subscriber, chat, wait_until

JOBS = 3


def visible_messages(stack: FaultStack, url: str) -> int:
    attributes = stack.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def test_a_dead_engine_stops_the_worker_and_its_jobs_go_to_the_next_one_unfailed(
    workers: FaultStack, subscriber: Subscriber, tmp_path: Path
):
    # GIVEN queued jobs, and a worker whose engine dies at its first generation (as a CUDA fault kills vLLM's), holding
    # its messages for a minute (the production visibility timeout) unless it hands them back
    marker = tmp_path / "engine-died"
    api = workers.api()
    job_ids = [api.submit(chat(f"dead engine {i}", max_tokens=2)).job_id for i in range(JOBS)]
    started = time.monotonic()
    doomed = workers.start_worker(
        "engine-dead", WORKER_FAULTS=f"engine_dead={marker}", VISIBILITY_TIMEOUT_S="60", HEARTBEAT_INTERVAL_S="5"
    )
    # WHEN the engine dies
    # THEN the worker exits promptly, with the status that tells its supervisor the engine died
    assert doomed.wait(timeout=30) == EXIT_ENGINE_DEAD, doomed.log_path.read_text()[-3000:]
    assert time.monotonic() - started < 20
    assert marker.exists() and "the engine dies at the generation" in doomed.log_path.read_text()
    # AND no job was failed, and every message is visible again now, not after the visibility timeout
    jobs = {j: workers.job(j) for j in job_ids}
    assert all(j.status.value in ("queued", "running") and j.error is None for j in jobs.values()), jobs
    assert visible_messages(workers, workers.config.queue_url) == JOBS

    # WHEN the supervisor starts a fresh worker with the same settings
    fresh = workers.start_worker("after-engine-dead", WORKER_FAULTS=f"engine_dead={marker}")
    jobs = workers.wait_final(job_ids, timeout_s=30)
    # THEN it finishes every job: none dead-lettered, each run once before the death and once after at most
    assert {j.status.value for j in jobs.values()} == {"succeeded"}, jobs
    assert all(j.attempts <= 2 for j in jobs.values())
    assert max(j.attempts for j in jobs.values()) == 2  # the dead engine's jobs were started there
    wait_until(lambda: workers.queue_depth() == 0, 10, "the messages to be deleted")
    assert workers.queue_depth(workers.config.dlq_url) == 0
    notes = subscriber.drain()
    assert all([n["status"] for n in notes[j]] == ["succeeded"] for j in job_ids)
    assert all(n.get("error") is None for j in job_ids for n in notes[j])
    workers.stop_worker(fresh)
