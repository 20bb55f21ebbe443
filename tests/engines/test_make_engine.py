"""Engines by name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_worker.engines import make_engine
from gpu_worker.engines.echo import EchoEngine


def test_options_reach_the_engine_and_the_environment_does_not(monkeypatch):
    # GIVEN a worker environment asking for 16 slots (WorkerSettings reads it, make_engine must not)
    monkeypatch.setenv("MAX_NUM_SEQS", "16")
    # WHEN an engine is made with explicit options
    engine = make_engine("echo", capacity=3)
    # THEN those are what it has
    assert isinstance(engine, EchoEngine) and engine.capacity == 3
    assert make_engine("simulated").capacity == 64


def test_an_unknown_engine_lists_the_known_ones():
    with pytest.raises(ValueError, match="echo, simulated, cpu, vllm"):
        make_engine("tgi")


def test_importing_the_engines_needs_neither_torch_nor_vllm():
    # GIVEN a fresh interpreter WHEN the package and the vLLM adapter are imported
    code = (
        "import sys, gpu_worker.engines, gpu_worker.engines.vllm_engine, gpu_worker.engines.cpu;"
        "import gpu_worker.engines.cpu_embedding;"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    # THEN none of the heavy packages was loaded
    assert out.strip() == "[]"
