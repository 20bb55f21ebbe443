"""``python3 -m gpu_worker.health``, the container health check: healthy while the worker's file is fresh."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def health_check(**env: str) -> subprocess.CompletedProcess[str]:
    """The check as ECS runs it: in the container's environment, its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "gpu_worker.health"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_file_touched_within_the_max_age_is_healthy(tmp_path: Path):
    (tmp_path / "health").touch()
    result = health_check(WORKER_HEALTH_FILE=str(tmp_path / "health"), HEALTH_MAX_AGE_S="30")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_a_stale_file_is_unhealthy_with_its_age_on_one_line(tmp_path: Path):
    # GIVEN a health file last touched two minutes ago
    path = tmp_path / "health"
    path.touch()
    two_minutes_ago = time.time() - 120
    os.utime(path, (two_minutes_ago, two_minutes_ago))
    # WHEN the check runs with a one-minute limit
    result = health_check(WORKER_HEALTH_FILE=str(path), HEALTH_MAX_AGE_S="60")
    # THEN it fails, saying how old the file is
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    # (the check's own start on a loaded machine may add a second or two to the age)
    assert re.search(r"was last touched 12[0-9] s ago \(limit 60 s\)", result.stderr), result.stderr


def test_a_missing_file_is_unhealthy(tmp_path: Path):
    result = health_check(WORKER_HEALTH_FILE=str(tmp_path / "never-written"))
    assert result.returncode == 1
    assert "never-written does not exist" in result.stderr


@pytest.mark.parametrize("value", ["soon", "0"])
def test_a_malformed_max_age_is_unhealthy_and_named(tmp_path: Path, value: str):
    (tmp_path / "health").touch()
    result = health_check(WORKER_HEALTH_FILE=str(tmp_path / "health"), HEALTH_MAX_AGE_S=value)
    assert result.returncode == 1
    assert f"HEALTH_MAX_AGE_S={value!r}" in result.stderr
