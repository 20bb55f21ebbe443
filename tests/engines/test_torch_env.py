"""What the CPU engines set before torch loads (gpu_worker.engines.torch_env): read once by libgomp, at torch's import,
so it is checked in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker.engines.torch_env import DEFAULTS

ROOT = Path(__file__).resolve().parents[2]

# The environment as it is at the moment torch is first imported, which is when libgomp reads it.
LOADED = """
import asyncio, json, os, sys

names = %r
at_import = {}


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not at_import:
            at_import.update({n: os.environ.get(n) for n in names})
        return None


sys.meta_path.insert(0, Watch())
import gpu_worker.engines.cpu as cpu

engine = cpu.CpuEngine(capacity=1)
asyncio.run(engine.start())
print(json.dumps({"torch_loaded": "torch" in sys.modules, "env": at_import}))
"""


def fresh(script: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.model
def test_the_cpu_engine_sets_brief_openmp_spinning_before_it_imports_torch():
    """A worker process imports torch first in the engine's load: with libgomp's own defaults its threads slept between
    the kernels of a step once the process held two teams (a step of one row about 1.7 times as long)."""
    seen = fresh(LOADED % (list(DEFAULTS),))
    assert seen["torch_loaded"] is True
    assert seen["env"] == DEFAULTS


@pytest.mark.model
def test_what_a_deployment_sets_is_kept():
    seen = fresh(LOADED % (list(DEFAULTS),), OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="0")
    assert seen["env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    assert seen["env"]["GOMP_SPINCOUNT"] == "0"
    assert seen["env"]["HF_HUB_OFFLINE"] == "1"
