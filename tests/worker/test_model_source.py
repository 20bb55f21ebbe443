"""The model's files from S3 (MODEL_S3_URI) into MODEL_DIR, against a moto server: what is there already is kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from async_inference.config import ServiceConfig, SettingsError
from async_inference_client import Client
from gpu_worker.config import WorkerSettings
from gpu_worker.model_source import MANIFEST_NAME, ModelSource, parse_s3_uri
from tests.faults.fault_stack import FaultStack, chat

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "tokenizer.json": b'{"version": "1.0"}' * 100,
    "weights/model-00001-of-00002.safetensors": os.urandom(3 * 1024 * 1024),
    "weights/model-00002-of-00002.safetensors": os.urandom(1024),
}


@pytest.fixture
def s3(stack: FaultStack) -> Any:
    return stack.client("s3")


@pytest.fixture
def model_uri(s3: Any, request: pytest.FixtureRequest) -> str:
    """A bucket holding a model's files under models/tiny/, and an object beside the prefix that is not one of them."""
    bucket = f"models-{abs(hash(request.node.name)) % 10**8}"
    s3.create_bucket(Bucket=bucket)
    for name, body in FILES.items():
        s3.put_object(Bucket=bucket, Key=f"models/tiny/{name}", Body=body)
    s3.put_object(Bucket=bucket, Key="models/tiny/", Body=b"")  # a console "folder"
    s3.put_object(Bucket=bucket, Key="models/tiny-other/config.json", Body=b"{}")
    return f"s3://{bucket}/models/tiny"


def test_the_prefix_is_copied_into_the_model_directory(s3: Any, model_uri: str, tmp_path: Path):
    report = ModelSource(model_uri, tmp_path / "model", s3=s3).sync()
    assert sorted(report.downloaded) == sorted(FILES) and report.kept == []
    assert {str(p.relative_to(tmp_path / "model")) for p in (tmp_path / "model").rglob("*") if p.is_file()} == {
        *FILES,
        MANIFEST_NAME,
    }
    assert all((tmp_path / "model" / name).read_bytes() == body for name, body in FILES.items())


def test_a_second_sync_keeps_what_is_there_and_fetches_only_what_changed(s3: Any, model_uri: str, tmp_path: Path):
    # GIVEN a synced directory
    source = ModelSource(model_uri, tmp_path / "model", s3=s3)
    source.sync()
    # WHEN nothing changed THEN nothing is downloaded
    assert source.sync().downloaded == []
    # WHEN one object is replaced by another of the same size, and one local file was cut short
    bucket, prefix = parse_s3_uri(model_uri)
    s3.put_object(Bucket=bucket, Key=f"{prefix}config.json", Body=b'{"architectures": ["MistralForCausalLM"]}'[:40])
    (tmp_path / "model" / "weights/model-00002-of-00002.safetensors").write_bytes(b"short")
    report = source.sync()
    # THEN exactly those two are fetched again, and the rest kept
    assert sorted(report.downloaded) == ["config.json", "weights/model-00002-of-00002.safetensors"]
    assert len(report.kept) == len(FILES) - 2
    assert (tmp_path / "model" / "config.json").read_bytes() == b'{"architectures": ["MistralForCausalLM"]}'[:40]
    assert (tmp_path / "model" / "weights/model-00002-of-00002.safetensors").read_bytes() == FILES[
        "weights/model-00002-of-00002.safetensors"
    ]


def test_a_file_not_recorded_as_downloaded_is_fetched(s3: Any, model_uri: str, tmp_path: Path):
    # A file of the right size that this source did not write (another model's, say) is not trusted by its size.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_bytes(b"x" * len(FILES["config.json"]))
    report = ModelSource(model_uri, tmp_path / "model", s3=s3).sync()
    assert "config.json" in report.downloaded
    assert (tmp_path / "model" / "config.json").read_bytes() == FILES["config.json"]


def test_a_sync_of_an_empty_prefix_fails(s3: Any, model_uri: str, tmp_path: Path):
    # (The worker waits for objects first, below: an empty prefix here means they were removed meanwhile.)
    bucket, _ = parse_s3_uri(model_uri)
    with pytest.raises(ValueError, match="holds no objects"):
        ModelSource(f"s3://{bucket}/models/missing/", tmp_path / "model", s3=s3).sync()


def test_waiting_for_the_weights_beats_until_their_config_arrives_last(s3: Any, model_uri: str, tmp_path: Path):
    # GIVEN an empty prefix, and the files uploaded there while a source waits for them, config.json last
    bucket, _ = parse_s3_uri(model_uri)
    source = ModelSource(f"s3://{bucket}/models/later/", tmp_path / "model", s3=s3)
    beats: list[float] = []

    def beat() -> None:
        beats.append(time.monotonic())
        if len(beats) == 2:
            s3.put_object(Bucket=bucket, Key="models/later/model.safetensors", Body=b"w")
        if len(beats) == 4:
            s3.put_object(Bucket=bucket, Key="models/later/config.json", Body=b"{}")

    # WHEN it waits THEN it returns only once config.json is there, having beaten (the health file) meanwhile
    assert source.wait_for_weights(stopping=lambda: False, beat=beat, poll_s=0.5) is True
    assert len(beats) >= 4
    assert sorted(source.sync().downloaded) == ["config.json", "model.safetensors"]


def test_waiting_for_an_empty_prefix_ends_when_the_worker_stops(s3: Any, model_uri: str, tmp_path: Path):
    bucket, _ = parse_s3_uri(model_uri)
    source = ModelSource(f"s3://{bucket}/models/never/", tmp_path / "model", s3=s3)
    started = time.monotonic()
    assert source.wait_for_weights(stopping=lambda: time.monotonic() - started > 1, beat=lambda: None) is False
    assert time.monotonic() - started < 5  # within a beat of the stop, not after a whole poll


def test_a_key_that_would_leave_the_directory_is_refused(s3: Any, model_uri: str, tmp_path: Path):
    bucket, prefix = parse_s3_uri(model_uri)
    s3.put_object(Bucket=bucket, Key=f"{prefix}../../escape.txt", Body=b"no")
    with pytest.raises(ValueError, match="outside"):
        ModelSource(model_uri, tmp_path / "model", s3=s3).sync()
    assert not (tmp_path / "escape.txt").exists()


def test_vllm_loads_the_synced_directory_under_the_model_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    env = {
        **ServiceConfig("t", "b", "q", "a").to_env(),
        "ENGINE": "vllm",
        "MODEL": "Qwen/Qwen2.5-1.5B-Instruct",
        "MODEL_S3_URI": "s3://models/qwen/",
        "MODEL_DIR": str(tmp_path),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    options = WorkerSettings.load().engine_options()
    assert options["model"] == str(tmp_path)
    assert options["served_model_name"] == "Qwen/Qwen2.5-1.5B-Instruct"


def test_a_model_uri_without_a_directory_is_refused(monkeypatch: pytest.MonkeyPatch):
    for name, value in {
        **ServiceConfig("t", "b", "q", "a").to_env(),
        "ENGINE": "echo",
        "MODEL_S3_URI": "s3://models/qwen/",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MODEL_DIR", raising=False)
    with pytest.raises(SettingsError, match="MODEL_S3_URI is set but MODEL_DIR is not"):
        WorkerSettings.load()
    monkeypatch.setenv("MODEL_S3_URI", "https://models/qwen/")
    with pytest.raises(SettingsError, match="MODEL_S3_URI='https://models/qwen/': .*not an s3://"):
        WorkerSettings.load()


def test_a_worker_waits_healthy_for_weights_not_uploaded_yet_then_runs_jobs(
    stack: FaultStack, api: Client, s3: Any, tmp_path: Path
):
    # GIVEN the stack's own model bucket as the first deploy leaves it: empty (issue 27, blocker 2: the worker exited,
    # ECS replaced it in a loop, and the deployment circuit breaker rolled the whole stack back)
    bucket = "models-not-uploaded-yet"
    s3.create_bucket(Bucket=bucket)
    health = tmp_path / "health"
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO_ROOT),
        **stack.env,
        "ENGINE": "echo",
        "RECEIVE_WAIT_S": "1",
        "MODEL_S3_URI": f"s3://{bucket}/qwen/",
        "MODEL_DIR": str(tmp_path / "model"),
        "WORKER_HEALTH_FILE": str(health),
        "HEALTH_MAX_AGE_S": "5",
        "HEARTBEAT_INTERVAL_S": "1",
    }
    health_check = [sys.executable, "-m", "gpu_worker.health"]
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "gpu_worker"], env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # WHEN it has run for a while (past the health file's maximum age)
        time.sleep(8)
        # THEN it is still running, passes the container's health check, and its log says what it waits for
        assert worker.poll() is None, log.read_text()[-3000:]
        assert subprocess.run(health_check, env=env, cwd=REPO_ROOT).returncode == 0
        assert f"s3://{bucket}/qwen/ holds no config.json yet: waiting for the model's files" in log.read_text()
        # WHEN the weights are uploaded, config.json last as docs/deploying.md says, THEN it syncs them and runs jobs
        for name in sorted(FILES, key=lambda name: name == "config.json"):
            s3.put_object(Bucket=bucket, Key=f"qwen/{name}", Body=FILES[name])
        job_id = api.submit(chat("after the upload", max_tokens=3)).job_id
        deadline = time.monotonic() + 60
        while api.get(job_id).status != "succeeded":
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert worker.returncode == 0, log.read_text()[-3000:]
    assert json.loads((tmp_path / "model" / MANIFEST_NAME).read_text()).keys() == FILES.keys()


def test_a_worker_syncs_the_model_before_it_takes_jobs(stack: FaultStack, api: Client, model_uri: str, tmp_path: Path):
    # GIVEN a worker told to take its model from S3
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO_ROOT),
        **stack.env,
        "ENGINE": "echo",
        "RECEIVE_WAIT_S": "1",
        "MODEL_S3_URI": model_uri,
        "MODEL_DIR": str(tmp_path / "model"),
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "gpu_worker"], env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # WHEN it has run a job
        job_id = api.submit(chat("after the sync", max_tokens=3)).job_id
        deadline = time.monotonic() + 30
        while api.get(job_id).status != "succeeded":
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    # THEN the model's files were in MODEL_DIR before it started taking jobs
    text = log.read_text()
    assert text.index("model files from") < text.index("worker started"), text
    assert json.loads((tmp_path / "model" / MANIFEST_NAME).read_text()).keys() == FILES.keys()
