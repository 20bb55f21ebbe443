"""Isolation and hygiene holes of issue 30, each through the local stack (deployed from the template): two key headers
of two tenants, bytes PUT for a deleted file, a filename that adds a parameter to Content-Disposition, a deleted
background response whose job and result stayed readable, and caller input too large to quote in a stored error."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
import requests
from botocore.exceptions import ClientError

from async_inference.aws import client
from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e
KEY_A, KEY_B = list(TENANT_KEYS)


def until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.3)


def raw_get(stack: LocalDeployment, path: str, headers: list[tuple[str, str]]) -> int:
    """A GET sending ``headers`` as given, a repeated name included (requests' dict cannot repeat one)."""
    url = urlsplit(stack.api_url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        connection.putrequest("GET", url.path + path)
        for name, value in headers:
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


# --- Keys -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [("x-api-key", KEY_A), ("x-api-key", KEY_B)],
        [("x-api-key", KEY_B), ("x-api-key", KEY_A)],
        [("Authorization", f"Bearer {KEY_A}"), ("Authorization", f"Bearer {KEY_B}")],
    ],
)
def test_a_key_header_sent_twice_is_401(stack, headers):
    # GIVEN each header alone is served (200) WHEN a request sends a key header twice, two tenants' keys
    assert raw_get(stack, "/v1/models", headers[:1]) == 200
    # THEN it is refused, as a Bearer key with another tenant's x-api-key is: never served as the last one's tenant
    assert raw_get(stack, "/v1/models", headers) == 401


# --- Files ----------------------------------------------------------------------------------------------------------


def test_bytes_put_for_a_file_deleted_before_its_upload_do_not_stay(stack):
    headers = {"x-api-key": KEY_A}
    data = b'{"custom_id": "a"}\n'
    # GIVEN a file awaiting its presigned upload, deleted before the bytes arrive
    made = requests.post(
        f"{stack.api_url}/v1/files/uploads",
        headers=headers,
        timeout=30,
        json={"purpose": "batch", "filename": "in.jsonl", "bytes": len(data)},
    )
    assert made.status_code == 201, made.text
    deleted = requests.delete(f"{stack.api_url}/v1/files/{made.json()['id']}", headers=headers, timeout=30)
    assert deleted.status_code == 200, deleted.text
    # WHEN the presigned PUT is used after all (it cannot be revoked: S3 takes it)
    upload = made.json()["upload"]
    assert requests.put(upload["url"], data=data, headers=upload["headers"], timeout=30).status_code == 200
    key = urlsplit(upload["url"]).path.split("/", 2)[2]
    s3 = client("s3")

    def gone() -> bool:
        try:
            s3.head_object(Bucket=stack.resources.config.bucket_name, Key=key)
        except ClientError:
            return True
        return False

    # THEN its upload event finds no file, and the bytes are deleted: nothing stays stored outside every record
    assert until(gone), f"{key} is still stored, in no record"


def test_a_filename_cannot_add_a_parameter_to_content_disposition(stack):
    headers = {"x-api-key": KEY_A}
    name = 'a"; filename="evil.html'
    data = b'{"custom_id": "a"}\n'
    # GIVEN a file named to close the quoted filename and add another (JSON carries the quotes as they are)
    made = requests.post(
        f"{stack.api_url}/v1/files/uploads",
        headers=headers,
        timeout=30,
        json={"purpose": "batch", "filename": name, "bytes": len(data)},
    )
    assert made.status_code == 201, made.text
    upload = made.json()["upload"]
    assert requests.put(upload["url"], data=data, headers=upload["headers"], timeout=30).status_code == 200
    # WHEN its content is downloaded (the API redirects to a presigned GET)
    content = requests.get(f"{stack.api_url}/v1/files/{made.json()['id']}/content", headers=headers, timeout=30)
    assert content.status_code == 200, content.text
    # THEN the header names one file: an ASCII fallback with no quote in it, and the name itself RFC 5987-encoded
    disposition = content.headers["Content-Disposition"]
    assert disposition.count("filename=") == 1 and disposition.count('"') == 2, disposition
    assert content.content == data
    assert "filename*=UTF-8''a%22%3B%20filename%3D%22evil.html" in disposition, disposition


# --- Responses ------------------------------------------------------------------------------------------------------


def test_a_deleted_background_response_takes_its_job_and_result_with_it(stack, worker):
    sdk = openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)
    headers = {"x-api-key": KEY_A}
    # GIVEN a completed background response, its job and its result URL readable
    created = sdk.responses.create(model="echo-model", input="forget me", background=True)
    job_url = f"{stack.api_url}/v1/jobs/job_{created.id.removeprefix('resp_')}"
    job = until(lambda: (j := requests.get(job_url, headers=headers, timeout=30).json()).get("result") and j, 60)
    assert job, "the response's job did not succeed"
    assert requests.get(job["result"]["url"], timeout=30).status_code == 200
    # WHEN the response is deleted
    sdk.responses.delete(created.id)
    # THEN its job is a 404 and the result URL given out before reads nothing
    assert requests.get(job_url, headers=headers, timeout=30).status_code == 404
    assert requests.get(job["result"]["url"], timeout=30).status_code == 404


# --- Errors that quote caller input ---------------------------------------------------------------------------------


def test_a_batch_line_with_a_420_kb_method_fails_the_batch_naming_the_line(stack):
    headers = {"x-api-key": KEY_A}
    line = {"custom_id": "a", "method": "P" * 420_000, "url": "/v1/chat/completions", "body": chat("hi")}
    # GIVEN an input file whose line's method is 420 KB
    file = requests.post(
        f"{stack.api_url}/v1/files",
        headers=headers,
        timeout=30,
        files={"file": ("in.jsonl", json.dumps(line).encode() + b"\n", "application/jsonl")},
        data={"purpose": "batch"},
    )
    assert file.status_code == 200, file.text
    # WHEN a batch is made of it
    created = requests.post(
        f"{stack.api_url}/v1/batches",
        headers=headers,
        timeout=30,
        json={"input_file_id": file.json()["id"], "completion_window": "24h", "endpoint": "/v1/chat/completions"},
    )
    assert created.status_code == 200, created.text
    batch_url = f"{stack.api_url}/v1/batches/{created.json()['id']}"
    batch = until(
        lambda: (b := requests.get(batch_url, headers=headers, timeout=30).json())["status"] == "failed" and b
    )
    # THEN it fails with an error naming the line and the method, quoting only its start
    assert batch, requests.get(batch_url, headers=headers, timeout=30).json()
    [error] = batch["errors"]["data"]
    assert (error["line"], error["code"], error["param"]) == (1, "invalid_method", "method"), error
    assert len(error["message"]) < 1_000


def test_an_upload_with_a_1_mb_field_name_fails_its_job_with_the_reason(api: Client):
    # GIVEN an upload job WHEN its uploaded request holds a field whose name is 1 MB
    body = json.dumps({**chat("hi"), "f" * 1_000_000: 1}).encode()
    created = api.submit_upload(body)
    # THEN the job fails with the reason, quoting the field's start
    final = api.wait(created.job_id, timeout_s=30)
    assert final.status == "failed" and "unknown field" in (final.error or ""), final
    assert len(final.error) < 2_000
