"""A local worker gets its task definition's ``Secrets`` as ECS injects them (issue 27): ``resolved_secrets`` existed
but nothing called it, so a worker run locally lacked what the deployment gives it (a Hugging Face token, say)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from local_runtime.template import TemplateError
from local_runtime.workers import Image, TaskDefinition, WorkerFleet

PRINT_ENV = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('HF_TOKEN', 'DB_PASSWORD')}))"


@pytest.fixture
def secretsmanager() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="us-east-1")


def _task(tmp_path: Path, secrets: dict[str, str]) -> TaskDefinition:
    image = Image(directory=tmp_path, environment={}, workdir="/app", entrypoint=["python3", "-c", PRINT_ENV])
    return TaskDefinition(image=image, environment={}, secrets=secrets, stop_timeout_s=5, health_check=None, mounts={})


def test_a_worker_starts_with_its_task_definitions_secrets(secretsmanager: Any, tmp_path: Path):
    # GIVEN a task definition with a whole secret and one JSON key of another (ValueFrom arn:json-key::)
    token = secretsmanager.create_secret(Name="hf-token", SecretString="hf_abc")["ARN"]
    database = secretsmanager.create_secret(Name="db", SecretString=json.dumps({"password": "s3cret", "user": "u"}))
    task = _task(tmp_path, {"HF_TOKEN": token, "DB_PASSWORD": f"{database['ARN']}:password::"})
    log = tmp_path / "worker.log"
    # WHEN the fleet starts a worker from it
    with open(log, "wb") as out:
        fleet = WorkerFleet(task, environment={}, volumes_dir=tmp_path, log=out, secretsmanager=secretsmanager)
        worker = fleet.add(supervised=False, python=sys.executable)
        assert worker.wait(timeout=30) == 0
    # THEN the worker's environment holds each secret's value, as the container's would
    assert json.loads(log.read_text()) == {"HF_TOKEN": "hf_abc", "DB_PASSWORD": "s3cret"}


def test_a_task_definition_with_secrets_needs_a_secrets_manager(tmp_path: Path):
    # GIVEN secrets and no client to read them WHEN a fleet is made THEN it is refused, naming the secrets
    with pytest.raises(TemplateError, match=r"secrets \(\['HF_TOKEN'\]\)"):
        WorkerFleet(
            _task(tmp_path, {"HF_TOKEN": "arn:aws:secretsmanager:us-east-1:1:secret:x"}),
            environment={},
            volumes_dir=tmp_path,
        )
