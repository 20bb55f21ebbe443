"""EventBridge events (issue 20): each job state change reaches a rule's SQS target on the local stack, through the
template's state-events function and moto's EventBridge, which delivers to SQS targets as EventBridge does."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from async_inference.aws import client
from async_inference_client import Client
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment
from local_runtime.synth import synthesize

KEY = "state-events-key-0123456789"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
FAST_WORKER = {"RECEIVE_WAIT_S": "1", "HEARTBEAT_INTERVAL_S": "1", "DRAIN_TIMEOUT_S": "5"}


@pytest.fixture(scope="module")
def inbox_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    assembly = synthesize(
        tmp_path_factory.mktemp("cdk.out.state-events"), {"tenants": {"events": {}}, "eventbridge_events": True}
    )
    logs = tmp_path_factory.mktemp("state-events-logs")
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


def test_each_job_state_change_reaches_an_eventbridge_rules_sqs_target(inbox_stack):
    # GIVEN a consumer's rule on the default bus matching the service's events, with an SQS queue as its target
    sqs, events = client("sqs"), client("events")
    queue_url = sqs.create_queue(QueueName=f"job-events-{free_port()}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="job-events", EventPattern=json.dumps({"source": ["async-inference"]}), State="ENABLED")
    events.put_targets(Rule="job-events", Targets=[{"Id": "queue", "Arn": queue_arn}])
    # WHEN a job runs to its end
    api = Client(inbox_stack.api_url, KEY)
    job = api.submit({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert api.wait(job.job_id, timeout_s=60).status == "succeeded"
    # THEN the target receives its start and its success, each with the job in its detail
    received: dict[str, dict] = {}
    deadline = time.monotonic() + 30
    while len(received) < 2 and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        ):
            event = json.loads(message["Body"])
            if event["detail"].get("job_id") == job.job_id:
                received[event["detail-type"]] = event
    assert set(received) == {"Job Started", "Job Succeeded"}
    succeeded = received["Job Succeeded"]
    assert succeeded["source"] == "async-inference"
    assert succeeded["detail"]["status"] == "succeeded" and succeeded["detail"]["tenant"] == "events"
    assert "result" not in succeeded["detail"] and succeeded["detail"]["result_location"]["key"]


def test_a_batchs_end_reaches_an_eventbridge_rules_sqs_target(inbox_stack):
    # GIVEN a consumer's rule on the default bus for the service's batch events, with an SQS queue as its target
    sqs, events = client("sqs"), client("events")
    queue_url = sqs.create_queue(QueueName=f"batch-events-{free_port()}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    pattern = {"source": ["async-inference"], "detail-type": [{"prefix": "Batch "}]}
    events.put_rule(Name="batch-events", EventPattern=json.dumps(pattern), State="ENABLED")
    events.put_targets(Rule="batch-events", Targets=[{"Id": "queue", "Arn": queue_arn}])
    # WHEN a batch of two lines runs to its end
    api = Client(inbox_stack.api_url, KEY)
    lines = [
        {
            "custom_id": f"l{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        }
        for n in range(2)
    ]
    data = "\n".join(json.dumps(line) for line in lines).encode()
    batch = api.create_batch(api.upload_file(data).id)
    assert api.wait_batch(batch.id, timeout_s=90).status == "completed"
    # THEN the target receives "Batch Completed" with the batch in its detail
    received = []
    deadline = time.monotonic() + 30
    while not received and time.monotonic() < deadline:
        messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        received += [json.loads(m["Body"]) for m in messages.get("Messages", [])]
    [event] = received
    assert event["detail-type"] == "Batch Completed" and event["detail"]["id"] == batch.id
    assert event["detail"]["batch"]["request_counts"]["completed"] == 2
