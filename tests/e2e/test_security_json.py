"""Hostile JSON through every entry point of the local stack (deployed from the template): a body nested 50,000 deep
or holding a 5,000-digit number is a 400 on the API, fails an upload job with its reason, and fails a batch naming
the line; never a 500, never a batch left ``validating``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import requests

from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e
KEY = next(iter(TENANT_KEYS))
DEEP = "[" * 50_000 + "]" * 50_000  # 100 KB: under the API's inline limit, so the parser sees it
HUGE = "1" * 5_000
CHAT = json.dumps(chat("hi"))


def post(stack: LocalDeployment, path: str, body: str) -> requests.Response:
    return requests.post(
        f"{stack.api_url}{path}",
        data=body.encode(),
        timeout=30,
        headers={"x-api-key": KEY, "content-type": "application/json"},
    )


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/v1/jobs", '{"request": ' + DEEP + "}", "JSON nested deeper than 64 levels"),
        ("/v1/jobs", '{"metadata": {"a": ' + DEEP + "}}", "JSON nested deeper than 64 levels"),
        ("/v1/jobs", '{"request": ' + CHAT[:-1] + ', "max_tokens": ' + HUGE + "}}", "more than 100 digits"),
        (
            "/v1/jobs",
            '{"request": ' + CHAT[:-1] + ', "seed": ' + "9" * 200 + "}}",
            "more than 100 digits (at request.seed)",
        ),
        ("/v1/batches", DEEP, "JSON nested deeper than 64 levels"),
        ("/v1/files/uploads", '{"bytes": ' + HUGE + "}", "more than 100 digits"),
    ],
)
def test_hostile_json_on_the_api_is_a_400_naming_the_limit(stack, path, body, says):
    # WHEN a tenant posts hostile JSON THEN it gets a 400 that names the limit, not a 500
    response = post(stack, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_json" and says in error["message"], error


def test_an_uploaded_request_of_hostile_json_fails_the_job_with_the_reason(api: Client):
    # GIVEN an upload job WHEN its uploaded request nests 50,000 deep
    created = api.submit_upload(('{"model": "echo-model", "messages": ' + DEEP + "}").encode())
    # THEN the job fails with the limit in its reason
    final = api.wait(created.job_id, timeout_s=30)
    assert final.status == "failed" and "the body is refused: JSON nested deeper than 64 levels" in final.error, final


def test_a_batch_with_a_hostile_line_fails_naming_the_line(stack):
    # GIVEN a batch input file whose second line nests 50,000 deep
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": json.loads(CHAT)})
    data = f"{good}\n{DEEP}\n".encode()
    file = requests.post(
        f"{stack.api_url}/v1/files",
        headers={"x-api-key": KEY},
        timeout=30,
        files={"file": ("in.jsonl", data, "application/jsonl")},
        data={"purpose": "batch"},
    )
    assert file.status_code == 200, file.text
    # WHEN a batch is made of it
    created = post(
        stack,
        "/v1/batches",
        json.dumps(
            {"input_file_id": file.json()["id"], "completion_window": "24h", "endpoint": "/v1/chat/completions"}
        ),
    )
    assert created.status_code == 200, created.text
    # THEN the controller fails it, naming the line and the limit
    batch = settled(stack, created.json()["id"])
    assert batch["status"] == "failed", batch
    [error] = batch["errors"]["data"]
    assert error["line"] == 2 and error["code"] == "invalid_json_line" and "nested deeper than 64" in error["message"]


def settled(stack: LocalDeployment, batch_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = requests.get(f"{stack.api_url}/v1/batches/{batch_id}", headers={"x-api-key": KEY}, timeout=30).json()
        if batch["status"] != "validating" or time.monotonic() > deadline:
            return batch
        time.sleep(0.3)
