"""Job events over the WebSocket API, on the template-deployed stack: a standard client (``websockets``) connects with
a tenant's key, subscribes, and is told each step of its jobs, in order, and nothing of another tenant's; the SDK's
``wait()`` follows a job the same way. The worker's echo engine takes 3 s a job, with a progress beat every 0.4 s."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from async_inference import settings
from async_inference_client import Client, JobUpdate
from local_runtime.moto_server import LOCAL_KEYS
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e

KEY_A, KEY_B = list(TENANT_KEYS)
FINAL = {"job.completed", "job.failed", "job.cancelled", "job.expired"}
ANSWER = " ".join(f"word{i}" for i in range(30))


@pytest.fixture(scope="module", autouse=True)
def slow_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ECHO_DELAY_S="3", PROGRESS_INTERVAL_S="0.4")
    yield process
    process.terminate()
    process.wait(timeout=30)


def socket(stack: LocalDeployment, key: str | None = KEY_A, *, in_query: bool = False) -> ClientConnection:
    assert stack.ws_url is not None
    if in_query:
        return connect(f"{stack.ws_url}?{settings.WS_API_KEY_QUERY_PARAMETER}={key}", open_timeout=20)
    return connect(stack.ws_url, additional_headers={"x-api-key": key} if key else None, open_timeout=20)


def subscribe(connection: ClientConnection, **scope: Any) -> dict[str, Any]:
    """Send a subscription; the API's reply."""
    connection.send(json.dumps({"action": "subscribe", **scope}))
    return json.loads(connection.recv(timeout=20))


def events_of(connection: ClientConnection, job_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The job's events as they arrive, until its final one."""
    events, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = json.loads(connection.recv(timeout=deadline - time.monotonic()))
        if message.get("job_id") == job_id:
            events.append(message)
            if message["type"] in FINAL:
                return events
    raise AssertionError(f"no final event for {job_id} within {timeout_s} s: {events}")


def test_a_subscriber_is_told_the_start_the_progress_and_the_end_in_order(stack: LocalDeployment, api: Client):
    # GIVEN a client connected with tenant-a's key in the x-api-key header, subscribed to all of its jobs
    with socket(stack) as connection:
        assert subscribe(connection, all=True) == {"type": "subscribed", "all": True}
        # WHEN tenant-a submits a job that runs for 3 s
        job = api.submit(chat(ANSWER))
        events = events_of(connection, job.job_id)
    # THEN it is told the job started, then its progress at least once, then that it completed, in that order
    types = [event["type"] for event in events]
    assert types[0] == "job.started" and types[-1] == "job.completed", types
    assert set(types[1:-1]) == {"job.progress"}, types
    # AND the progress is the tokens so far, rising, never past the answer's 30
    tokens = [event["progress"]["completion_tokens"] for event in events if event["type"] == "job.progress"]
    assert tokens == sorted(tokens) and 0 < tokens[-1] <= 30, tokens
    assert all("updated_at" in event["progress"] for event in events if event["type"] == "job.progress")
    assert api.get(job.job_id).status.value == "succeeded"


def test_the_sdk_waits_for_a_job_over_the_websocket(stack: LocalDeployment, api: Client):
    # GIVEN the SDK's client with the stack's WebSocket URL
    client = Client(stack.api_url, KEY_A, ws_url=stack.ws_url)
    job = client.submit(chat(ANSWER))
    updates: list[JobUpdate] = []
    # WHEN it waits for the job
    final = client.wait(job.job_id, timeout_s=60, on_update=updates.append)
    # THEN the job succeeded, and it was told its start, its progress and its end over the socket
    assert final.status.value == "succeeded" and final.result is not None
    pushed = [
        (u.status.value, u.progress.completion_tokens if u.progress else None) for u in updates if u.via == "push"
    ]
    assert pushed[-1] == ("succeeded", None), pushed
    progress = [tokens for status, tokens in pushed if tokens is not None]
    assert progress and progress == sorted(progress), pushed
    # AND it read the job twice only: once subscribed, once at the end
    assert [u.via for u in updates].count("poll") == 2, updates


def test_a_connection_is_told_only_its_own_tenants_jobs_and_only_those_it_follows(stack: LocalDeployment, api: Client):
    # GIVEN tenant-b subscribed to all of its jobs and to a job id of tenant-a, and tenant-a following one job only
    first, second = api.submit(chat("one two three")), api.submit(chat("four five six"))
    with socket(stack, KEY_B) as other, socket(stack, KEY_A) as mine:
        assert subscribe(other, all=True)["type"] == "subscribed"
        assert subscribe(other, job_ids=[first.job_id])["type"] == "subscribed"
        assert subscribe(mine, job_ids=[second.job_id]) == {"type": "subscribed", "job_ids": [second.job_id]}
        # WHEN both jobs run to their end
        told = events_of(mine, second.job_id)
        for job in (first, second):
            deadline = time.monotonic() + 60
            while api.get(job.job_id).status.value != "succeeded" and time.monotonic() < deadline:
                time.sleep(0.2)
        time.sleep(2.0)  # what the push had queued has arrived by now
        # THEN tenant-b heard nothing of either, and tenant-a heard only the job it follows
        with pytest.raises(TimeoutError):
            other.recv(timeout=0.5)
        assert told[-1]["type"] == "job.completed"
        late = []
        try:
            while True:
                late.append(json.loads(mine.recv(timeout=0.5)))
        except TimeoutError:
            pass
        assert all(message.get("job_id") != first.job_id for message in told + late)


@pytest.mark.parametrize("key", ["not-a-key-of-any-tenant-000", None])
def test_an_unknown_or_missing_key_is_refused_at_connect(stack: LocalDeployment, key: str | None):
    with pytest.raises(InvalidStatus) as refused:
        socket(stack, key)
    assert refused.value.response.status_code == 403


def test_a_browser_connects_with_the_key_as_a_query_parameter(stack: LocalDeployment):
    with socket(stack, KEY_A, in_query=True) as connection:
        assert subscribe(connection, all=True) == {"type": "subscribed", "all": True}


@pytest.mark.parametrize(
    ("message", "code", "says"),
    [
        ({"action": "subscribe"}, "invalid_subscription", "exactly one of"),
        ({"action": "subscribe", "job_ids": ["job_1"]}, "invalid_subscription", "job_ids.0"),
        ({"action": "watch", "job_ids": []}, "unknown_action", '"action": "subscribe"'),
        ("not json", "unknown_action", '"action": "subscribe"'),
    ],
)
def test_a_message_that_is_not_a_subscription_is_answered_with_what_to_fix(stack: LocalDeployment, message, code, says):
    with socket(stack) as connection:
        connection.send(message if isinstance(message, str) else json.dumps(message))
        answer = json.loads(connection.recv(timeout=20))
    assert answer["type"] == "error" and answer["code"] == code and says in answer["message"], answer


def test_a_connection_that_is_gone_is_forgotten_when_the_push_finds_it_closed(stack: LocalDeployment, api: Client):
    # GIVEN a connection item whose connection closed without a $disconnect (API Gateway delivers it best effort)
    assert stack.resources is not None
    table = boto3.resource("dynamodb").Table(stack.resources.outputs["ConnectionTableName"])
    table.put_item(
        Item={
            settings.CONNECTION_TABLE_PARTITION_KEY: "Z29uZUNvbm4=",
            settings.CONNECTION_TENANT_KEY: "tenant-a",
            "all": True,
            settings.CONNECTION_TTL_ATTRIBUTE: int(time.time()) + 3600,
        }
    )
    # WHEN an event of tenant-a's is pushed
    with socket(stack) as connection:
        subscribe(connection, all=True)
        job = api.submit(chat("short"))
        events_of(connection, job.job_id)
    # THEN the management API answered GoneException for it, and the push deleted its item
    deadline = time.monotonic() + 10
    while table.get_item(Key={settings.CONNECTION_TABLE_PARTITION_KEY: "Z29uZUNvbm4="}).get("Item") is not None:
        assert time.monotonic() < deadline, "the gone connection's item is still there"
        time.sleep(0.2)


def test_the_management_api_answers_as_api_gateway_does(stack: LocalDeployment):
    # GIVEN the boto3 client the push function uses, pointed at the local management API
    assert stack.websocket is not None
    management = boto3.client(
        "apigatewaymanagementapi",
        endpoint_url=stack.websocket.management_url,
        region_name="us-east-1",
        **{k.lower(): v for k, v in LOCAL_KEYS.items()},
    )
    # WHEN it posts to a connection that does not exist THEN it gets GoneException
    with pytest.raises(management.exceptions.GoneException):
        management.post_to_connection(ConnectionId="bm9ib2R5SGVyZQ==", Data=b"{}")


def test_a_connection_follows_at_most_a_thousand_job_ids(stack: LocalDeployment):
    # GIVEN a connection that subscribed to 1,000 job ids in ten messages of 100
    ids = [f"job_{i:032x}" for i in range(settings.WS_MAX_JOB_IDS_PER_CONNECTION + 1)]
    with socket(stack) as connection:
        for start in range(0, settings.WS_MAX_JOB_IDS_PER_CONNECTION, settings.WS_MAX_JOB_IDS_PER_SUBSCRIBE):
            chunk = ids[start : start + settings.WS_MAX_JOB_IDS_PER_SUBSCRIBE]
            assert subscribe(connection, job_ids=chunk)["type"] == "subscribed"
        # WHEN it asks for one more THEN it is told to subscribe to all instead
        answer = subscribe(connection, job_ids=ids[-1:])
        assert answer["code"] == "too_many_subscriptions" and "'all': true" in answer["message"], answer
        # AND the ids it already had are still one set, not doubled by a second subscription to them
        assert subscribe(connection, job_ids=ids[:5])["type"] == "subscribed"


def test_a_connection_following_a_batch_is_told_its_end(stack: LocalDeployment):
    # GIVEN a connection that follows a batch of two lines (and another that follows all of tenant B's work)
    import openai

    from tests.e2e.test_batches_openai import jsonl, line, upload

    sdk = openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)
    source = upload(sdk, jsonl([line("ws-0"), line("ws-1")]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    with socket(stack) as follower, socket(stack, KEY_B) as other:
        assert subscribe(follower, batch_id=batch.id)["type"] == "subscribed"
        assert subscribe(other, all=True)["type"] == "subscribed"
        # WHEN the worker runs its lines and the controller finalizes it
        deadline = time.monotonic() + 90
        while True:
            message = json.loads(follower.recv(timeout=deadline - time.monotonic()))
            if message.get("batch_id") == batch.id:
                break
        # THEN the follower is told the batch completed, with its counts; the other tenant is told nothing
        assert message == {
            "schema_version": "1",
            "type": "batch.completed",
            "batch_id": batch.id,
            "status": "completed",
            "request_counts": {"total": 2, "completed": 2, "failed": 0},
        }
        with pytest.raises(TimeoutError):
            other.recv(timeout=1)
