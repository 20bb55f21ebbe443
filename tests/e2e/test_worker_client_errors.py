"""A job the worker refuses as the request's fault fails with OpenAI's error code, and ``GET /v1/jobs/{id}`` shows it
beside the message; on the local stack deployed from the template, with the echo engine (a context of 64 words)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e
KEY = next(iter(TENANT_KEYS))


@pytest.fixture(scope="module")
def short_context_worker(stack: LocalDeployment) -> Iterator[None]:
    process = stack.start_worker(ECHO_MAX_MODEL_LEN="64")
    yield
    process.terminate()
    process.wait(timeout=30)


def job_after(stack: LocalDeployment, request: dict) -> dict:
    """The job of ``request`` as GET /v1/jobs/{id} shows it once final."""
    submitted = requests.post(
        f"{stack.api_url}/v1/jobs", json={"request": request}, headers={"x-api-key": KEY}, timeout=30
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]
    for _ in range(300):
        view = requests.get(f"{stack.api_url}/v1/jobs/{job_id}", headers={"x-api-key": KEY}, timeout=30).json()
        if view["status"] in ("succeeded", "failed", "cancelled", "expired"):
            return view
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not final: {view}")


@pytest.mark.parametrize(
    ("overrides", "code", "says"),
    [
        ({"max_tokens": 100}, "context_length_exceeded", "maximum context length is 64"),
        ({"logprobs": True}, "invalid_request", "logprobs"),
    ],
    ids=["prompt too long for the context", "a parameter the engine cannot honour"],
)
def test_a_job_the_worker_refuses_as_the_requests_fault_shows_its_error_code(
    stack, short_context_worker, overrides, code, says
):
    # WHEN a request the API accepts reaches a worker that refuses it as the client's fault
    view = job_after(stack, chat("hi", **overrides))
    # THEN the job failed with the error code a client reads to fix the request, beside the message
    assert (view["status"], view["error_code"]) == ("failed", code), view
    assert says in view["error"], view
