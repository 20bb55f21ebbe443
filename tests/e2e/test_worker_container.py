"""The worker runs as its task definition says: the image's and the container's configuration, what ECS provides,
and the local overrides, nothing inherited; and a supervisor replaces it when it dies, as ECS replaces a task."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from async_inference.config import DEFAULT_HEALTH_FILE
from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from local_runtime.workers import ECS_PROVIDED, WorkerFleet
from tests.e2e.conftest import chat

pytestmark = pytest.mark.e2e


def test_a_worker_gets_the_task_definitions_environment_and_nothing_from_its_starter(
    stack: LocalDeployment, monkeypatch
):
    assert stack.fleet is not None
    monkeypatch.setenv("STARTER_ONLY_VARIABLE", "1")
    env = stack.fleet.environment()
    task = stack.fleet.task
    # THEN every variable of the container definition is there, resolved (the region among them)...
    for name, value in task.environment.items():
        if name not in ("ENGINE", "MODEL", "MODEL_S3_URI"):  # the local overrides, see local_runtime.stack
            assert env[name] == value, name
    assert env["AWS_REGION"] == task.environment["AWS_REGION"]
    assert env["JOBS_QUEUE_URL"] == stack.resources.config.queue_url
    # ...with the image's own variables, its WORKDIR mapped to the staged build context...
    assert env["PYTHONPATH"] == str(task.image.directory)
    assert (task.image.directory / "gpu_worker" / "worker.py").is_file()
    # ...what ECS provides, the local engine, and nothing from the process that started it
    assert all(env[k] == v for k, v in ECS_PROVIDED.items())
    assert env["ENGINE"] == "echo" and "MODEL" not in env
    assert "STARTER_ONLY_VARIABLE" not in env and "VIRTUAL_ENV" not in env and "PYTEST_CURRENT_TEST" not in env


def test_without_the_task_definitions_region_the_worker_cannot_start(stack: LocalDeployment, tmp_path):
    # GIVEN the container environment without the region the task definition now sets (the deployed defect)
    assert stack.fleet is not None
    log = open(tmp_path / "worker.log", "wb")
    process = stack.start_worker(log=log, unset=("AWS_REGION", "AWS_DEFAULT_REGION"))
    # WHEN it starts THEN boto3 finds no region and the worker exits
    assert process.wait(timeout=60) != 0
    assert "NoRegionError" in (tmp_path / "worker.log").read_text()


def test_a_killed_worker_is_replaced_and_the_queue_keeps_being_served(stack: LocalDeployment, api: Client):
    assert stack.fleet is not None
    replaced_before = stack.fleet.replacements
    # GIVEN a supervised worker (as `make up` runs them)
    first = stack.start_worker(supervised=True)
    try:
        # WHEN it is killed
        time.sleep(1)
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while stack.fleet.replacements == replaced_before and time.monotonic() < deadline:
            time.sleep(0.2)
        # THEN the supervisor starts another in its place, which runs the next job
        assert stack.fleet.replacements == replaced_before + 1
        replacement = next(p for p in stack.workers if p is not first and p.poll() is None)
        job = api.submit(chat("after the replacement"))
        assert api.wait(job.job_id, timeout_s=60).status == "succeeded"
    finally:
        for process in stack.workers:
            if process is first or process.poll() is None:
                stack.stop_worker(process)
    assert replacement.poll() is not None


def test_a_worker_whose_engine_dies_is_replaced_and_its_jobs_then_succeed(
    stack: LocalDeployment, api: Client, tmp_path
):
    # GIVEN a supervised worker whose engine dies at its first generation (a CUDA fault; the replacement is healthy)
    assert stack.fleet is not None
    replaced_before = stack.fleet.replacements
    marker = tmp_path / "engine-died-once"
    first = stack.start_worker(supervised=True, WORKER_FAULTS=f"engine_dead={marker}")
    try:
        # WHEN jobs arrive
        jobs = [api.submit(chat(f"engine dies {i}")).job_id for i in range(3)]
        finals = [api.wait(job_id, timeout_s=90) for job_id in jobs]
        # THEN the worker exited non-zero, the supervisor replaced it, and every job succeeded, none dead-lettered
        assert marker.exists() and first.poll() == 3
        assert stack.fleet.replacements == replaced_before + 1
        assert [f.status for f in finals] == ["succeeded"] * 3, [(f.status, f.error) for f in finals]
        assert all(f.attempts <= 2 for f in finals)
    finally:
        for process in stack.workers:
            if process.poll() is None:
                stack.stop_worker(process)


def test_a_worker_failing_its_health_check_is_stopped_and_replaced(stack: LocalDeployment, tmp_path):
    # GIVEN the task definition's health check command, run every second, and a worker that stops responding (SIGSTOP
    # freezes its loops, so its health file goes stale)
    assert stack.fleet is not None and stack.fleet.task.health_check is not None
    check = {**stack.fleet.task.health_check, "Interval": 1, "Retries": 2, "StartPeriod": 0}
    fleet = WorkerFleet(
        dataclasses.replace(stack.fleet.task, health_check=check, stop_timeout_s=3),
        environment=stack._worker_overrides(),
        volumes_dir=tmp_path,
        unset=("MODEL",),
        log=open(tmp_path / "workers.log", "wb"),
    ).start(0)
    try:
        frozen = fleet.add(HEALTH_MAX_AGE_S="3", HEARTBEAT_INTERVAL_S="0.5", RECEIVE_WAIT_S="1")
        time.sleep(3)
        assert fleet.replacements == 0  # healthy while it runs
        os.kill(frozen.pid, signal.SIGSTOP)
        # WHEN its checks keep failing, while another task's worker on the same host keeps its own health file fresh
        # at the default path (a container's /tmp is its own; every local worker shared the host's, and a frozen
        # worker passed its checks on another's heartbeat: make test's other stacks made this test fail or wait)
        deadline = time.monotonic() + 60
        while fleet.replacements == 0 and time.monotonic() < deadline:
            Path(DEFAULT_HEALTH_FILE).touch()
            time.sleep(0.2)
        # THEN the supervisor stops it and starts a replacement
        assert fleet.replacements == 1
        assert frozen.poll() is not None
        assert any(p is not frozen and p.poll() is None for p in fleet.processes)
    finally:
        fleet.stop()
