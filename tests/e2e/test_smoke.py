"""``make smoke`` (``async-inference smoke``): one job through a deployed stack, found by its outputs, to the answer.

The stack's outputs come from CloudFormation in the stack's moto server, as ``cdk deploy`` leaves them in an account:
``ApiUrl`` (here the local API) and ``ApiKeyId<tenant>`` (the id of the tenant's key in API Gateway, whose value the
command reads with GetApiKey)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from async_inference.aws import client
from local_runtime.stack import LocalDeployment

REPO_ROOT = Path(__file__).resolve().parents[2]


def deployed_outputs(stack: LocalDeployment, key_value: str) -> str:
    """A CloudFormation stack in moto holding the outputs a deploy gives: the API's URL and the tenant's key id."""
    [key_id] = [
        k["id"] for k in client("apigateway").get_api_keys(includeValues=True)["items"] if k["value"] == key_value
    ]
    name = f"Smoke{uuid.uuid4().hex[:8]}"
    template = {
        "Resources": {"Marker": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {"ApiUrl": {"Value": f"{stack.api_url}/"}, "ApiKeyIdtenanta": {"Value": key_id}},
    }
    client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))
    return name


def smoke(stack: LocalDeployment, *args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "async_inference.cli", "--json", "smoke", "--model", "echo-model", *args],
        env=stack.env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout)


def test_smoke_finds_the_stack_by_its_outputs_and_prints_the_first_answer_with_its_wait(stack, worker):
    # GIVEN a deployed stack's outputs in CloudFormation and a running worker
    name = deployed_outputs(stack, "tenant-a-key-0123456789")
    # WHEN the smoke command runs against the stack by name
    code, figures = smoke(stack, "--stack-name", name)
    # THEN the job succeeded with the model's answer, and the time it stayed queued and ran are told apart
    assert code == 0, figures
    assert figures["status"] == "succeeded" and figures["model"] == "echo-model"
    assert "five words" in figures["answer"]  # the echo engine answers the prompt's words
    assert figures["queued_s"] >= 0 and figures["ran_s"] >= 0
    assert figures["submit_to_end_s"] >= figures["ran_s"]


def test_a_stack_whose_workers_never_start_times_out_with_the_job_going_on(stack, api):
    # GIVEN the stack with no worker (a GPU that never comes: quota 0, no capacity)
    name = deployed_outputs(stack, "tenant-a-key-0123456789")
    # WHEN the smoke command follows its job for 3 s
    code, figures = smoke(stack, "--stack-name", name, "--timeout", "3")
    # THEN it exits 5 (the client's wait timeout), naming the job, which stays queued for a worker
    assert code == 5 and figures["status"] == "timed_out"
    assert api.get(figures["job_id"]).status.value == "queued"
    api.cancel(figures["job_id"])  # leave the shared queue as the test found it
