"""The batch lane's settings: the two queues and the table go together; the reserve leaves batch lines a slot."""

from __future__ import annotations

import pytest

from async_inference import config as env
from async_inference.config import ServiceConfig, SettingsError
from gpu_worker.config import WorkerSettings
from gpu_worker.worker import WorkerConfig

SERVICE = ServiceConfig(table_name="jobs", bucket_name="claims", queue_url="http://127.0.0.1:9/q", topic_arn="arn:t")
BATCH = {
    env.ENV_BATCH_QUEUE_URL: "http://127.0.0.1:9/batch",
    env.ENV_BATCH_CONTROL_QUEUE_URL: "http://127.0.0.1:9/c",
    env.ENV_BATCH_TABLE: "batches",
}


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for field in WorkerSettings.model_fields.values():
        monkeypatch.delenv(field.alias or "", raising=False)
    for name, value in {**SERVICE.to_env(), env.ENV_ENGINE: "echo"}.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_without_the_batch_variables_the_worker_serves_the_interactive_lane_only(worker_env: pytest.MonkeyPatch):
    config = WorkerSettings.load().worker_config()
    assert config.batch_queue_url is None and config.control_queue_url is None


def test_the_batch_variables_reach_the_worker_config(worker_env: pytest.MonkeyPatch):
    for name, value in {**BATCH, env.ENV_INTERACTIVE_RESERVE: "2"}.items():
        worker_env.setenv(name, value)
    settings = WorkerSettings.load()
    config = settings.worker_config()
    assert (config.batch_queue_url, config.control_queue_url) == (
        BATCH["BATCH_QUEUE_URL"],
        BATCH["BATCH_CONTROL_QUEUE_URL"],
    )
    assert settings.batch_table_name == "batches" and config.reserve(64) == 2


@pytest.mark.parametrize("missing", list(BATCH))
def test_a_batch_lane_missing_one_of_its_three_variables_is_refused_naming_it(
    worker_env: pytest.MonkeyPatch, missing: str
):
    for name, value in BATCH.items():
        if name != missing:
            worker_env.setenv(name, value)
    with pytest.raises(SettingsError, match=f"the batch lane needs .* together; {missing} not set"):
        WorkerSettings.load()


def test_a_reserve_of_every_engine_slot_is_refused(worker_env: pytest.MonkeyPatch):
    worker_env.setenv(env.ENV_MAX_NUM_SEQS, "8")
    worker_env.setenv(env.ENV_INTERACTIVE_RESERVE, "8")
    with pytest.raises(SettingsError, match="INTERACTIVE_RESERVE=8 must be below MAX_NUM_SEQS=8"):
        WorkerSettings.load()


def test_the_default_reserve_is_one_slot_in_64():
    config = WorkerConfig(service=SERVICE)
    assert (config.reserve(16), config.reserve(64), config.reserve(256)) == (1, 1, 4)


def test_a_batch_queue_without_a_control_queue_is_refused_in_the_config_too():
    with pytest.raises(ValueError, match="batch_queue_url and control_queue_url go together"):
        WorkerConfig(service=SERVICE, batch_queue_url="http://127.0.0.1:9/batch")
