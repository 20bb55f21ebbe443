"""A worker whose engine does not start in time exits non-zero, never healthy (issue #21, defect 3): a deploy whose
model cannot load does not complete as healthy, and a start that hangs does not hold its GPU forever."""

from __future__ import annotations

import time
from pathlib import Path

from gpu_worker.config import ENV_START_TIMEOUT_S
from gpu_worker.worker import EXIT_START_TIMEOUT
from tests.faults.fault_stack import FaultStack, wait_until


def test_a_start_that_outlasts_its_deadline_exits_non_zero_without_ever_touching_the_health_file(
    stack: FaultStack, tmp_path: Path
):
    # GIVEN a worker whose engine start blocks its event loop for 30 s (a hung vLLM engine build), with a 3 s deadline
    path = tmp_path / "health"
    began = time.monotonic()
    worker = stack.start_worker(
        "start-deadline", WORKER_FAULTS="slow_start=30", WORKER_HEALTH_FILE=str(path), **{ENV_START_TIMEOUT_S: "3"}
    )
    try:
        # WHEN the deadline passes
        wait_until(lambda: worker.poll() is not None, 25, "the worker to give up its start")
    finally:
        stack.stop_worker(worker)
    # THEN it exited with its start-timeout status, long before the start would have ended, saying why
    assert worker.returncode == EXIT_START_TIMEOUT
    assert time.monotonic() - began < 25
    assert "did not start within 3 s" in worker.log_path.read_text()
    # AND it never claimed to be healthy
    assert not path.exists()
