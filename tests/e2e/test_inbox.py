"""The inbox (issue 20): a file dropped under an inbox rule's prefix on the local stack becomes a job (any object) or a
batch (a .jsonl), whose result and notification arrive; the S3 notification with its prefix filter is the template's,
delivered by moto to the function's local event queue."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from async_inference.aws import client
from async_inference_client import Client
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment
from local_runtime.subscribers import subscribe_queue
from local_runtime.synth import synthesize

KEY = "events-key-0123456789"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"  # the stack's model; the echo engine answers it
RULES = [{"prefix": "docs/", "tenant": "events", "model": MODEL}]
FAST_WORKER = {"RECEIVE_WAIT_S": "1", "HEARTBEAT_INTERVAL_S": "1", "DRAIN_TIMEOUT_S": "5"}


@pytest.fixture(scope="module")
def inbox_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    assembly = synthesize(
        tmp_path_factory.mktemp("cdk.out.events"), {"tenants": {"events": {}}, "inbox_rules": json.dumps(RULES)}
    )
    logs = tmp_path_factory.mktemp("events-logs")
    local = LocalDeployment(
        assembly=assembly,
        api_port=free_port(),
        moto_port=free_port(),
        api_keys={KEY: "events"},
        workers=1,
        engine="echo",
        worker_env=FAST_WORKER,
        worker_log=open(logs / "workers.log", "ab"),
        log_dir=logs,
    ).start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in local.env.items():
            patch.setenv(name, value)
        yield local
    local.stop()


def _found(api: Client, key: str, timeout_s: float = 30.0):
    """The tenant's job whose metadata names the object, once the event has made it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for job in api.list().jobs:
            if job.metadata.get("source_key") == key:
                return job
        time.sleep(0.5)
    raise AssertionError(f"no job for {key} within {timeout_s} s")


def _notifications(queue_url: str, subject: str, timeout_s: float = 30.0) -> list[dict]:
    sqs, found, deadline = client("sqs"), [], time.monotonic() + timeout_s
    while not found and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            body = json.loads(message["Body"])
            if subject in (body.get("job_id"), body.get("data", {}).get("id")):
                found.append(body)
    return found


def test_a_text_file_dropped_under_the_prefix_becomes_a_job_whose_result_and_notification_arrive(inbox_stack):
    # GIVEN the stack with a rule for inbox/docs/, and a subscriber of the result topic
    api = Client(inbox_stack.api_url, KEY)
    subscriber = subscribe_queue(inbox_stack.resources.config.topic_arn, f"events-{free_port()}")
    # WHEN a pipeline writes a text document under the prefix
    key = "inbox/docs/2026/report.txt"
    client("s3").put_object(Bucket=inbox_stack.resources.config.bucket_name, Key=key, Body=b"summarise this report")
    # THEN it becomes a job of the rule's tenant and model, which succeeds with the echo of the text
    job = _found(api, key)
    assert job.metadata == {"source_key": key, "rule": "docs/"}
    done = api.wait(job.job_id, timeout_s=60)
    assert done.status == "succeeded" and done.model == MODEL
    assert api.result(done).choices[0].message.content == "summarise this report"
    # AND its notification arrives on the result topic
    [notification] = _notifications(subscriber, job.job_id)
    assert notification["status"] == "succeeded" and notification["tenant"] == "events"
    # AND an object outside the prefix is no job
    client("s3").put_object(Bucket=inbox_stack.resources.config.bucket_name, Key="inbox/other/x.txt", Body=b"x")
    time.sleep(3)
    assert [j.metadata.get("source_key") for j in api.list().jobs] == [key]


def test_a_jsonl_file_dropped_under_the_prefix_becomes_a_batch_that_completes(inbox_stack):
    # GIVEN the rule for inbox/docs/
    api = Client(inbox_stack.api_url, KEY)
    lines = [
        {
            "custom_id": f"line-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"line {n}"}], "max_tokens": 8},
        }
        for n in range(3)
    ]
    # WHEN a pipeline writes a JSONL file of three chat lines under the prefix
    key = "inbox/docs/nightly.jsonl"
    body = "\n".join(json.dumps(line) for line in lines).encode()
    client("s3").put_object(Bucket=inbox_stack.resources.config.bucket_name, Key=key, Body=body)
    # THEN it becomes one batch of the tenant, naming the object, that completes with three output lines
    deadline = time.monotonic() + 30
    batches = []
    while not batches and time.monotonic() < deadline:
        batches = [b for b in api.list_batches().data if (b.metadata or {}).get("source_key") == key]
        time.sleep(0.5)
    [batch] = batches
    done = api.wait_batch(batch.id, timeout_s=90)
    assert done.status == "completed" and done.request_counts.completed == 3
    output = [json.loads(line) for line in api.file_content(done.output_file_id).splitlines()]
    assert sorted(line["custom_id"] for line in output) == ["line-0", "line-1", "line-2"]
