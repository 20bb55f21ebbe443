"""Scale-in: SIGTERM makes a busy worker hand its unfinished jobs back at once; ECS task protection as its
TASK_PROTECTION mode says: only for jobs that could outlast the drain (the task definition's long_jobs), or whenever
it is busy (busy)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from local_runtime.moto_server import free_port
from tests.faults.fault_stack import FaultStack, Subscriber, chat, wait_until


class FakeEcsAgent:
    """The ECS agent's task-protection endpoint: records every PUT body."""

    def __init__(self) -> None:
        self.states: list[dict] = []
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802 - the stdlib's name
                if self.path == "/task-protection/v1/state":
                    agent.states.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def enabled(self) -> list[bool]:
        return [s["ProtectionEnabled"] for s in self.states]


@pytest.fixture
def ecs_agent() -> Iterator[FakeEcsAgent]:
    agent = FakeEcsAgent()
    yield agent
    agent.server.shutdown()


def test_sigterm_hands_unfinished_jobs_back_at_once_and_another_worker_finishes_them(
    workers: FaultStack, subscriber: Subscriber, ecs_agent: FakeEcsAgent
):
    # GIVEN a busy worker in ECS (task protection endpoint) with the production 60 s visibility timeout, whose jobs
    # take 20 s each, and which may drain for 1 s only
    busy = workers.start_worker(
        "busy",
        ECHO_DELAY_S="20",
        DRAIN_TIMEOUT_S="1",
        VISIBILITY_TIMEOUT_S="60",
        HEARTBEAT_INTERVAL_S="15",
        ECS_AGENT_URI=ecs_agent.uri,
        TASK_PROTECTION="busy",
    )
    api = workers.api()
    job_ids = [api.submit(chat(f"scale in {i}", max_tokens=2)).job_id for i in range(4)]
    wait_until(lambda: all(workers.job(j).status.value == "running" for j in job_ids), 20, "all jobs to run")
    # THEN while it holds jobs the task is protected from scale-in
    assert ecs_agent.enabled == [True]
    assert ecs_agent.states[0]["ExpiresInMinutes"] > 0
    # WHEN ECS stops the task (SIGTERM), with another worker running
    other = workers.start_worker("other")
    time.sleep(1)  # let it start polling
    stopped_at = time.monotonic()
    busy.send_signal(signal.SIGTERM)
    # THEN the busy worker exits cleanly after its drain timeout, clearing the protection
    assert busy.wait(timeout=15) == 0
    assert ecs_agent.enabled == [True, False]
    # AND the other worker finishes every job within a few seconds, not after the 60 s visibility timeout
    jobs = workers.wait_final(job_ids, timeout_s=15)
    assert time.monotonic() - stopped_at < 10
    assert {j.status.value for j in jobs.values()} == {"succeeded"}
    assert all(j.attempts == 2 for j in jobs.values())  # started on the busy worker, finished on the other
    notes = subscriber.drain()
    assert all([n["status"] for n in notes[j]] == ["succeeded"] for j in job_ids)
    workers.stop_worker(other)


def test_sigterm_lets_running_jobs_finish_within_the_drain_timeout(workers: FaultStack, ecs_agent: FakeEcsAgent):
    # GIVEN a worker whose jobs take 2 s, allowed to drain for 10 s
    busy = workers.start_worker(
        "drain", ECHO_DELAY_S="2", DRAIN_TIMEOUT_S="10", ECS_AGENT_URI=ecs_agent.uri, TASK_PROTECTION="busy"
    )
    api = workers.api()
    job_ids = [api.submit(chat(f"drain {i}")).job_id for i in range(3)]
    wait_until(lambda: all(workers.job(j).status.value == "running" for j in job_ids), 20, "all jobs to run")
    # WHEN it is stopped
    busy.send_signal(signal.SIGTERM)
    # THEN it finishes them itself before exiting, takes nothing new, and leaves protection cleared
    assert busy.wait(timeout=15) == 0
    jobs = {j: workers.job(j) for j in job_ids}
    assert {j.status.value for j in jobs.values()} == {"succeeded"}
    assert all(j.attempts == 1 for j in jobs.values())
    assert workers.queue_depth() == 0
    assert ecs_agent.enabled == [True, False]


def test_a_busy_worker_renews_its_task_protection_before_it_expires(workers: FaultStack, ecs_agent: FakeEcsAgent):
    # GIVEN a worker in ECS that renews its protection every second (in production: every 15 of its 60 minutes)
    worker = workers.start_worker(
        "renew",
        ECHO_DELAY_S="5",
        TASK_PROTECTION_RENEW_S="1",
        HEARTBEAT_INTERVAL_S="0.5",
        ECS_AGENT_URI=ecs_agent.uri,
        TASK_PROTECTION="busy",
    )
    # WHEN it is busy with one job for 5 s
    job_id = workers.api().submit(chat("a long one", max_tokens=2)).job_id
    assert workers.wait_final([job_id], timeout_s=30)[job_id].status.value == "succeeded"
    wait_until(lambda: ecs_agent.enabled[-1:] == [False], 5, "protection to be cleared")
    # THEN it set the protection again, with a fresh expiry, several times while busy, and cleared it once idle
    enables = ecs_agent.enabled[:-1]
    assert len(enables) >= 3 and all(enables), ecs_agent.states
    assert all(s["ExpiresInMinutes"] > 0 for s in ecs_agent.states[:-1])
    # AND an idle worker renews nothing
    time.sleep(2)
    assert ecs_agent.enabled[-1] is False and ecs_agent.enabled.count(False) == 1
    workers.stop_worker(worker)


def test_task_protection_is_cleared_when_the_worker_goes_idle(workers: FaultStack, ecs_agent: FakeEcsAgent):
    worker = workers.start_worker("idle", ECS_AGENT_URI=ecs_agent.uri, TASK_PROTECTION="busy")
    job_id = workers.api().submit(chat("quick")).job_id
    workers.wait_final([job_id])
    wait_until(lambda: ecs_agent.enabled == [True, False], 5, "protection to be set then cleared")
    workers.stop_worker(worker)
    assert ecs_agent.enabled == [True, False]  # stopping an idle worker changes nothing


# long_jobs at 10 tokens a second and a 1 s drain: max_tokens 2 is a 0.2 s job, max_tokens 100 a 10 s one.
LONG_JOBS = {"TASK_PROTECTION_TOKENS_PER_S": "10", "DRAIN_TIMEOUT_S": "1"}


def test_the_deployed_mode_protects_only_while_a_job_that_could_outlast_the_drain_runs(
    workers: FaultStack, ecs_agent: FakeEcsAgent
):
    # GIVEN a worker in ECS with the task definition's TASK_PROTECTION (long_jobs), whose jobs each take 2 s
    worker = workers.start_worker("long-jobs", ECHO_DELAY_S="2", ECS_AGENT_URI=ecs_agent.uri, **LONG_JOBS)
    api = workers.api()
    # WHEN it runs jobs whose max_tokens fit the drain THEN it never asks for protection
    short = [api.submit(chat(f"short {i}", max_tokens=2)).job_id for i in range(3)]
    assert {j.status.value for j in workers.wait_final(short, timeout_s=30).values()} == {"succeeded"}
    assert ecs_agent.states == []
    # WHEN it runs one whose max_tokens could outlast the drain, beside a short one
    long = api.submit(chat("long", max_tokens=100)).job_id
    api.submit(chat("short beside it", max_tokens=2))
    wait_until(lambda: workers.job(long).status.value == "running", 20, "the long job to run")
    # THEN it is protected while that job runs, and cleared once it is done
    wait_until(lambda: ecs_agent.enabled == [True], 5, "protection for the long job")
    workers.wait_final([long], timeout_s=30)
    wait_until(lambda: ecs_agent.enabled == [True, False], 5, "protection to be cleared")
    workers.stop_worker(worker)
    assert ecs_agent.enabled == [True, False]


def test_a_busy_worker_of_short_jobs_can_be_stopped_and_its_jobs_finish_in_the_drain(
    workers: FaultStack, ecs_agent: FakeEcsAgent
):
    # GIVEN a long_jobs worker busy with jobs shorter than its drain (1 s jobs, 5 s drain), so unprotected: what a
    # step-down may stop
    busy = workers.start_worker(
        "stepped-down",
        ECHO_DELAY_S="1",
        ECS_AGENT_URI=ecs_agent.uri,
        TASK_PROTECTION="long_jobs",
        TASK_PROTECTION_TOKENS_PER_S="10",
        DRAIN_TIMEOUT_S="5",
    )
    api = workers.api()
    job_ids = [api.submit(chat(f"step down {i}", max_tokens=2)).job_id for i in range(3)]
    wait_until(lambda: all(workers.job(j).status.value == "running" for j in job_ids), 20, "all jobs to run")
    assert ecs_agent.states == []
    # WHEN ECS stops it (SIGTERM)
    busy.send_signal(signal.SIGTERM)
    # THEN it finishes them itself within the drain, once each, and never asked for protection
    assert busy.wait(timeout=15) == 0
    jobs = {j: workers.job(j) for j in job_ids}
    assert {j.status.value for j in jobs.values()} == {"succeeded"}
    assert all(j.attempts == 1 for j in jobs.values())
    assert ecs_agent.states == []


def test_protection_off_never_calls_the_agent(workers: FaultStack, ecs_agent: FakeEcsAgent):
    worker = workers.start_worker(
        "off", ECHO_DELAY_S="2", ECS_AGENT_URI=ecs_agent.uri, TASK_PROTECTION="off", **LONG_JOBS
    )
    job_id = workers.api().submit(chat("long but unprotected", max_tokens=100)).job_id
    assert workers.wait_final([job_id], timeout_s=30)[job_id].status.value == "succeeded"
    workers.stop_worker(worker)
    assert ecs_agent.states == []
