"""The worker's settings: one class reads the container's environment at start; a bad variable stops it, named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from async_inference.config import ServiceConfig, SettingsError
from gpu_worker.config import EngineName, WorkerSettings
from gpu_worker.engines import ENGINE_NAMES, make_engine
from gpu_worker.engines.simulated import SimulatedEngine

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE = ServiceConfig(table_name="jobs", bucket_name="claims", queue_url="http://127.0.0.1:9/q", topic_arn="arn:t")


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment holding only the service's resources (what the stack sets besides the worker's own)."""
    for name in WorkerSettings.model_fields.values():
        monkeypatch.delenv(name.alias or "", raising=False)
    for name, value in SERVICE.to_env().items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_the_engine_names_are_the_ones_make_engine_knows():
    assert get_args(EngineName) == ENGINE_NAMES


def test_without_engine_the_settings_refuse_naming_the_variable_and_the_choices(worker_env: pytest.MonkeyPatch):
    with pytest.raises(SettingsError, match="ENGINE is not set .*echo, simulated, cpu or vllm"):
        WorkerSettings.load()


def test_without_its_job_queue_the_worker_refuses_naming_the_variable(worker_env: pytest.MonkeyPatch):
    # GIVEN a worker's environment without JOBS_QUEUE_URL (optional for the functions, which route by model)
    worker_env.setenv("ENGINE", "echo")
    worker_env.delenv("JOBS_QUEUE_URL")
    # WHEN its settings are read THEN they refuse, naming the variable and what it holds
    with pytest.raises(SettingsError, match="JOBS_QUEUE_URL is not set .*the job queue of the worker's model"):
        WorkerSettings.load()


def test_an_unknown_engine_is_refused(worker_env: pytest.MonkeyPatch):
    worker_env.setenv("ENGINE", "tgi")
    with pytest.raises(SettingsError, match="ENGINE='tgi'"):
        WorkerSettings.load()


def test_vllm_without_a_model_is_refused_at_start(worker_env: pytest.MonkeyPatch):
    worker_env.setenv("ENGINE", "vllm")
    with pytest.raises(SettingsError, match="MODEL is not set: ENGINE=vllm needs the model"):
        WorkerSettings.load()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_NUM_SEQS", "lots"),
        ("MAX_NUM_SEQS", "0"),
        ("HEARTBEAT_INTERVAL_S", "-1"),
        ("RECEIVE_WAIT_S", "30"),
        ("ENFORCE_EAGER", "perhaps"),
        ("GPU_MEMORY_UTILIZATION", "1.5"),
        ("WORKER_FAULTS", "crash=nowhere"),
    ],
)
def test_a_malformed_variable_is_named_with_its_value(worker_env: pytest.MonkeyPatch, name: str, value: str):
    worker_env.setenv("ENGINE", "echo")
    worker_env.setenv(name, value)
    with pytest.raises(SettingsError, match=f"{name}={value!r}: "):
        WorkerSettings.load()


def test_the_engine_gets_the_variables_it_takes_and_no_others(worker_env: pytest.MonkeyPatch):
    # GIVEN a simulated engine's variables, and a vLLM one it does not take
    for name, value in {
        "ENGINE": "simulated",
        "MAX_NUM_SEQS": "16",
        "SIM_STEP_S": "0.02",
        "SIM_OUTPUT_TOKENS": "100",
        "GPU_MEMORY_UTILIZATION": "0.5",
    }.items():
        worker_env.setenv(name, value)
    # WHEN the worker reads its settings and makes its engine
    config = WorkerSettings.load()
    engine = make_engine(config.engine, **config.engine_options())
    # THEN the engine has them
    assert config.engine_options() == {"capacity": 16, "step_s": 0.02, "output_tokens": 100}
    assert isinstance(engine, SimulatedEngine) and engine.capacity == 16
    assert engine.stats.ceiling_tokens_per_s == 800
    # AND the worker finds the service's resources
    assert config.worker_config().service == SERVICE


def test_the_worker_process_refuses_to_start_without_engine():
    # GIVEN the environment of a worker whose task definition forgot ENGINE (the resources would not even answer)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT), **SERVICE.to_env()}
    # WHEN the worker starts THEN it exits at once, saying what is missing (it used to run the echo engine)
    process = subprocess.run(
        [sys.executable, "-m", "gpu_worker"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert process.returncode == 2
    assert "ENGINE is not set" in process.stderr


def test_a_heartbeat_slower_than_the_health_limit_is_refused(worker_env: pytest.MonkeyPatch):
    # The heartbeat is what keeps the health file fresh: slower than the limit, a healthy worker would be restarted.
    worker_env.setenv("ENGINE", "echo")
    worker_env.setenv("HEARTBEAT_INTERVAL_S", "30")
    worker_env.setenv("HEALTH_MAX_AGE_S", "20")
    with pytest.raises(SettingsError, match="HEARTBEAT_INTERVAL_S=30 must be below HEALTH_MAX_AGE_S=20"):
        WorkerSettings.load()


def test_the_task_protection_modes_are_the_ones_the_stack_may_set():
    from async_inference.config import TASK_PROTECTION_MODES

    assert get_args(WorkerSettings.model_fields["task_protection"].annotation) == TASK_PROTECTION_MODES


def test_task_protection_defaults_to_long_jobs_and_reaches_the_worker(worker_env: pytest.MonkeyPatch):
    # GIVEN the echo engine and no TASK_PROTECTION WHEN the settings load THEN the worker protects long jobs only,
    # at the default 20 tokens a second; the variables set override both
    worker_env.setenv("ENGINE", "echo")
    config = WorkerSettings.load().worker_config()
    assert (config.task_protection, config.task_protection_tokens_per_s) == ("long_jobs", 20.0)
    worker_env.setenv("TASK_PROTECTION", "busy")
    worker_env.setenv("TASK_PROTECTION_TOKENS_PER_S", "35")
    config = WorkerSettings.load().worker_config()
    assert (config.task_protection, config.task_protection_tokens_per_s) == ("busy", 35.0)


@pytest.mark.parametrize(("name", "value"), [("TASK_PROTECTION", "always"), ("TASK_PROTECTION_TOKENS_PER_S", "0")])
def test_a_bad_task_protection_setting_is_refused_by_name(worker_env: pytest.MonkeyPatch, name: str, value: str):
    worker_env.setenv("ENGINE", "echo")
    worker_env.setenv(name, value)
    with pytest.raises(SettingsError, match=f"{name}='{value}'"):
        WorkerSettings.load()
