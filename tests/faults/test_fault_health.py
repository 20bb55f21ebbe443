"""The container health check against a real worker: unhealthy while the model loads (with the event loop blocked), so
that only a started engine makes a task healthy (issue #21, defect 3); healthy while the worker runs; unhealthy once
its loop stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.faults.fault_stack import REPO_ROOT, FaultStack, chat, wait_until

MAX_AGE_S = "3"


def healthy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_worker.health"],
        capture_output=True,
        text=True,
        timeout=30,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "WORKER_HEALTH_FILE": str(path),
            "HEALTH_MAX_AGE_S": MAX_AGE_S,
        },
    )


def test_the_worker_is_unhealthy_while_its_engine_loads_healthy_once_it_runs_and_unhealthy_when_its_loop_stops(
    workers: FaultStack, tmp_path: Path
):
    # GIVEN a worker whose engine start blocks its event loop for 15 s (as vLLM's engine build does), with a health
    # file that must be at most 3 s old (15, not 8: the checks below spawn a process each, and on a busy host the
    # last one, begun within the first 5 s of the load, ended after an 8 s load had ended)
    path = tmp_path / "health"
    worker = workers.start_worker(
        "health",
        WORKER_FAULTS="slow_start=15",
        WORKER_HEALTH_FILE=str(path),
        HEALTH_MAX_AGE_S=MAX_AGE_S,
        HEARTBEAT_INTERVAL_S="0.5",
    )
    wait_until(lambda: "the engine start blocks" in worker.log_path.read_text(), 20, "the engine start to begin")
    # THEN the health check fails throughout the load: no engine has started
    loading_until = time.monotonic() + 5  # of the 15
    while time.monotonic() < loading_until:
        result = healthy(path)
        assert result.returncode == 1, "healthy before the engine started"
        time.sleep(0.5)
    assert "worker started" not in worker.log_path.read_text()  # that really was during the load
    # AND it passes once the engine has started
    wait_until(lambda: healthy(path).returncode == 0, 20, "the health check to pass after the start")
    assert "worker started" in worker.log_path.read_text()
    # AND while the worker runs jobs
    job_id = workers.api().submit(chat("healthy", max_tokens=1)).job_id
    assert workers.wait_final([job_id], timeout_s=30)[job_id].status.value == "succeeded"
    assert healthy(path).returncode == 0
    # WHEN the worker's loop stops (the process is frozen)
    worker.send_signal(signal.SIGSTOP)
    try:
        time.sleep(float(MAX_AGE_S) + 1.5)
        # THEN the health check fails, saying why
        result = healthy(path)
        assert result.returncode == 1
        assert "the worker's loop is stuck" in result.stderr
    finally:
        worker.send_signal(signal.SIGCONT)
    workers.stop_worker(worker)
