"""checks/gpu_check.sh skips (exit 0, saying what is missing) where it cannot run, instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "checks" / "gpu_check.sh"


def run_with_fake_nvidia_smi(tmp_path: Path, smi_exit: int) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexit {smi_exit}\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_a_gpu_driver_that_sees_no_gpu_is_a_skip(tmp_path):
    result = run_with_fake_nvidia_smi(tmp_path, smi_exit=1)
    assert result.returncode == 0
    assert "SKIP gpu_check: nvidia-smi finds no GPU" in result.stdout


def test_a_gpu_without_vllm_is_a_skip_that_names_what_to_install(tmp_path):
    # GIVEN a GPU (a fake nvidia-smi) and a Python without vllm (this test's own)
    result = run_with_fake_nvidia_smi(tmp_path, smi_exit=0)

    # THEN the script skips and says what it needs
    assert result.returncode == 0
    assert "SKIP gpu_check: vllm is not importable" in result.stdout
    assert "needs: an NVIDIA GPU, the vllm package" in result.stdout
