"""Engines by name, configured from the worker's environment."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpu_worker.engines import make_engine
from gpu_worker.engines.echo import EchoEngine
from gpu_worker.engines.simulated import SimulatedEngine


def test_simulated_engine_takes_its_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("MAX_NUM_SEQS", "16")
    monkeypatch.setenv("SIM_STEP_S", "0.02")
    monkeypatch.setenv("SIM_OUTPUT_TOKENS", "100")

    engine = make_engine("simulated")

    assert isinstance(engine, SimulatedEngine)
    assert engine.capacity == 16
    assert engine.stats.ceiling_tokens_per_s == 800


def test_explicit_options_override_the_environment(monkeypatch):
    monkeypatch.setenv("MAX_NUM_SEQS", "16")
    engine = make_engine("echo", capacity=3)
    assert isinstance(engine, EchoEngine) and engine.capacity == 3


def test_a_malformed_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("MAX_NUM_SEQS", "lots")
    with pytest.raises(ValueError, match="MAX_NUM_SEQS='lots'"):
        make_engine("simulated")


def test_an_unknown_engine_lists_the_known_ones():
    with pytest.raises(ValueError, match="echo, simulated, cpu, vllm"):
        make_engine("tgi")


def test_importing_the_engines_needs_neither_torch_nor_vllm():
    # GIVEN a fresh interpreter WHEN the package and the vLLM adapter are imported
    code = (
        "import sys, gpu_worker.engines, gpu_worker.engines.vllm_engine, gpu_worker.engines.cpu;"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    # THEN none of the heavy packages was loaded
    assert out.strip() == "[]"
