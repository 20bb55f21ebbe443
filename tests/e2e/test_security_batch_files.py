"""A batch runs the input file as it was when the batch was created: a re-PUT of the file's presigned URL (valid 15
minutes) after that cannot change what the batch validates and runs."""

from __future__ import annotations

import json
import time

import pytest
import requests

from async_inference.aws import client
from async_inference.batches.store import BatchStore
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e
KEY = next(iter(TENANT_KEYS))


def line(custom_id: str, prompt: str) -> bytes:
    return (
        json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": chat(prompt)}
        ).encode()
        + b"\n"
    )


def test_a_re_put_of_the_input_file_after_the_batch_was_created_changes_nothing_it_runs(stack: LocalDeployment):
    headers = {"x-api-key": KEY}
    original, swapped = line("a", "the checked request"), line("a", "a swapped request!!")
    assert len(original) == len(swapped)
    # GIVEN a batch input file uploaded through its presigned URL, and a batch made of it
    made = requests.post(
        f"{stack.api_url}/v1/files/uploads",
        headers=headers,
        timeout=30,
        json={"purpose": "batch", "filename": "in.jsonl", "bytes": len(original)},
    )
    assert made.status_code == 201, made.text
    upload = made.json()["upload"]
    assert requests.put(upload["url"], data=original, headers=upload["headers"], timeout=30).status_code == 200
    batch = requests.post(
        f"{stack.api_url}/v1/batches",
        headers=headers,
        timeout=30,
        json={"input_file_id": made.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    ).json()
    # WHEN the same URL is PUT again with other bytes of the same size
    assert requests.put(upload["url"], data=swapped, headers=upload["headers"], timeout=30).status_code == 200
    # THEN the batch validates and runs its own copy, which holds the bytes it was created with
    deadline = time.monotonic() + 30
    while (record := BatchStore(stack.resources.batch_table_name).get_batch(batch["id"])).status.value == "validating":
        assert time.monotonic() < deadline, "the batch was not planned"
        time.sleep(0.3)
    assert record.status.value == "in_progress", record
    stored = client("s3").get_object(Bucket=stack.resources.config.bucket_name, Key=record.input_key)["Body"].read()
    assert stored == original
