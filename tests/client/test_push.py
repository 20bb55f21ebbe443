"""wait() over the WebSocket API, against a small websockets server in the test that speaks the push protocol
(subscribe with ``job_ids``, then ``job.*`` events), and its fallback to polling when the socket fails or closes."""

from __future__ import annotations

import asyncio
import json
import threading
from time import monotonic
from typing import Any

import pytest
from pydantic import ValidationError
from websockets.sync.server import ServerConnection

from async_inference_client import AsyncClient, Client, JobUpdate
from async_inference_client.models.jobs import JobStatus, Subscription
from local_runtime.moto_server import free_port
from tests.client.fake_api import (
    JOB_ID,
    OTHER_JOB_ID,
    FakeApi,
    FakePush,
    FakeTime,
    Reply,
    Seen,
    event,
    job_view,
    subscribed,
    succeeded_view,
    until_closed,
)

KEY = "test-key-0123456789abcdef"


class Job:
    """One job's state, read by the fake API's GET and moved on by the fake push server as it tells the client."""

    def __init__(self, status: str = "queued") -> None:
        self.status = status
        self.read = threading.Event()  # the client has read the job once
        self.api = FakeApi(self.respond)

    def respond(self, seen: Seen) -> Reply:
        self.read.set()
        if self.status == "succeeded":
            return Reply(200, succeeded_view(self.api.url))
        return Reply(200, job_view(self.status))


def tell_the_whole_run(job: Job):
    def converse(connection: ServerConnection, subscription: dict[str, Any]) -> None:
        job.read.wait(10)  # the client reads the job once subscribed: the run starts after that
        job.status = "running"
        connection.send(event("job.started"))
        connection.send(event("job.progress", progress={"completion_tokens": 5, "updated_at": "2026-12-01T12:00:00Z"}))
        job.status = "succeeded"
        connection.send(event("job.completed"))
        until_closed(connection)

    return converse


def test_wait_is_told_over_the_websocket_and_reads_the_job_only_around_it():
    # GIVEN a push server that tells the job's start, its progress and its end
    time, job, updates = FakeTime(), Job(), []
    push = FakePush(tell_the_whole_run(job))
    with job.api, push:
        # WHEN the client waits with the WebSocket URL
        client = Client(job.api.url, KEY, ws_url=push.url, sleep=time.sleep, clock=time.clock)
        final = client.wait(JOB_ID, on_update=updates.append)
    # THEN it subscribed to this job with its key in the x-api-key header
    assert push.subscriptions == [{"action": "subscribe", "job_ids": [JOB_ID]}]
    assert push.headers[0]["x-api-key"] == KEY
    # AND it was told each step, progress included, and the end is the API's final view with the result
    assert [(u.via, u.status.value, u.progress and u.progress.completion_tokens) for u in updates] == [
        ("poll", "queued", None),
        ("push", "running", None),
        ("push", "running", 5),
        ("push", "succeeded", None),
        ("poll", "succeeded", None),
    ]
    assert final.status is JobStatus.SUCCEEDED and final.result is not None
    # AND it read the job twice (once subscribed, once at the end) and never slept to poll
    assert len(job.api.gets()) == 2 and time.sleeps == []


def test_when_the_socket_closes_wait_polls_the_same_job_to_its_end():
    # GIVEN a push server that tells the start, then closes the socket; the job ends a few polls later
    time, job = FakeTime(), Job()

    def close_early(connection: ServerConnection, subscription: dict[str, Any]) -> None:
        job.read.wait(10)
        job.status = "running"
        connection.send(event("job.started"))
        connection.close()

    push = FakePush(close_early)
    gets_after_close = []

    def respond(seen: Seen) -> Reply:
        if job.status == "running" and push.subscriptions:
            gets_after_close.append(seen)
            if len(gets_after_close) >= 4:
                job.status = "succeeded"
        return Job.respond(job, seen)

    job.api.respond = respond
    with job.api, push:
        final = Client(job.api.url, KEY, ws_url=push.url, sleep=time.sleep, clock=time.clock).wait(JOB_ID)
    # THEN the wait went on by polling and saw the job succeed: nothing lost
    assert final.status is JobStatus.SUCCEEDED
    assert len(time.sleeps) >= 2, "it polled, with sleeps between"


def test_when_no_websocket_answers_wait_polls():
    time, job = FakeTime(), Job("running")
    nobody = f"ws://127.0.0.1:{free_port()}"

    def respond(seen: Seen) -> Reply:
        if len(job.api.gets()) >= 3:
            job.status = "succeeded"
        return Job.respond(job, seen)

    job.api.respond = respond
    with job.api:
        final = Client(job.api.url, KEY, ws_url=nobody, sleep=time.sleep, clock=time.clock).wait(JOB_ID)
    assert final.status is JobStatus.SUCCEEDED and len(time.sleeps) == 2


def test_a_silent_websocket_is_checked_with_a_get_each_push_check_interval():
    # GIVEN a push server that subscribes the client and then says nothing; the job ends on its own
    time, job, done = FakeTime(), Job("running"), threading.Event()

    def silent(connection: ServerConnection, subscription: dict[str, Any]) -> None:
        done.wait(10)

    def respond(seen: Seen) -> Reply:
        if len(job.api.gets()) >= 3:
            job.status = "succeeded"
        return Job.respond(job, seen)

    job.api.respond = respond
    push = FakePush(silent)
    with job.api, push:
        final = Client(job.api.url, KEY, ws_url=push.url, push_check_s=0.1, sleep=time.sleep, clock=time.clock).wait(
            JOB_ID
        )
        done.set()
    # THEN the client still learnt the end, by a GET after each quiet interval rather than by polling on a schedule
    assert final.status is JobStatus.SUCCEEDED
    assert len(job.api.gets()) == 3 and time.sleeps == []


def test_other_jobs_events_and_messages_it_does_not_know_are_ignored():
    time, job, updates = FakeTime(), Job("running"), []

    def noisy(connection: ServerConnection, subscription: dict[str, Any]) -> None:
        job.read.wait(10)
        connection.send(json.dumps({"type": "subscribed", "job_ids": [JOB_ID]}))
        connection.send("not json at all")
        connection.send(event("job.completed", OTHER_JOB_ID))
        connection.send(event("job.teleported"))
        job.status = "succeeded"
        connection.send(event("job.completed"))
        until_closed(connection)

    push = FakePush(noisy)
    with job.api, push:
        Client(job.api.url, KEY, ws_url=push.url, sleep=time.sleep, clock=time.clock).wait(
            JOB_ID, on_update=updates.append
        )
    assert [(u.via, u.job_id, u.status.value) for u in updates] == [
        ("poll", JOB_ID, "running"),
        ("push", JOB_ID, "succeeded"),
        ("poll", JOB_ID, "succeeded"),
    ]


def test_a_job_already_final_when_subscribed_is_returned_at_once():
    # The end may come before the subscription: the GET after subscribing sees it, no event is awaited.
    time, job = FakeTime(), Job("succeeded")
    push = FakePush(lambda connection, subscription: until_closed(connection))
    with job.api, push:
        final = Client(job.api.url, KEY, ws_url=push.url, sleep=time.sleep, clock=time.clock).wait(JOB_ID)
    assert final.status is JobStatus.SUCCEEDED and len(job.api.gets()) == 1


def test_the_async_client_is_told_over_the_websocket_too():
    time, job, updates = FakeTime(), Job(), []
    push = FakePush(tell_the_whole_run(job))

    async def wait() -> JobStatus:
        async with AsyncClient(job.api.url, KEY, ws_url=push.url, sleep=time.async_sleep, clock=time.clock) as client:
            return (await client.wait(JOB_ID, on_update=updates.append)).status

    with job.api, push:
        assert asyncio.run(wait()) is JobStatus.SUCCEEDED
    assert push.subscriptions == [{"action": "subscribe", "job_ids": [JOB_ID]}]
    assert [u.progress and u.progress.completion_tokens for u in updates if u.via == "push"] == [None, 5, None]
    assert len(job.api.gets()) == 2 and time.sleeps == []


def test_the_async_client_falls_back_to_polling_when_the_socket_closes():
    time, job = FakeTime(), Job("running")

    def close_at_once(connection: ServerConnection, subscription: dict[str, Any]) -> None:
        connection.close()

    def respond(seen: Seen) -> Reply:
        if len(job.api.gets()) >= 3:
            job.status = "succeeded"
        return Job.respond(job, seen)

    job.api.respond = respond
    push = FakePush(close_at_once)

    async def wait() -> JobUpdate | None:
        async with AsyncClient(job.api.url, KEY, ws_url=push.url, sleep=time.async_sleep, clock=time.clock) as client:
            return JobUpdate.of_view(await client.wait(JOB_ID))

    with job.api, push:
        final = asyncio.run(wait())
    assert final is not None and final.status is JobStatus.SUCCEEDED and time.sleeps


def test_a_subscription_is_for_jobs_a_batch_or_all():
    assert Subscription(all=True).model_dump(exclude_none=True) == {"action": "subscribe", "all": True}
    assert Subscription(batch_id="b-1").model_dump(exclude_none=True) == {"action": "subscribe", "batch_id": "b-1"}


@pytest.mark.parametrize("scopes", [{}, {"job_ids": [JOB_ID], "all": True}, {"job_ids": []}, {"job_ids": ["job_1"]}])
def test_a_subscription_without_exactly_one_valid_scope_is_refused(scopes):
    with pytest.raises(ValidationError):
        Subscription(**scopes)


def test_wait_reads_the_job_only_once_the_api_has_acknowledged_the_subscription():
    # GIVEN a WebSocket API that takes 0.5 s to store the subscription (its function runs) before it replies
    time_, job = FakeTime(), Job("running")
    read_at: list[float] = []

    def slow_reply(subscription: dict[str, Any]) -> str:
        threading.Event().wait(0.5)
        return subscribed(subscription)

    def respond(seen: Seen) -> Reply:
        read_at.append(monotonic())
        job.status = "succeeded"
        return Job.respond(job, seen)

    job.api.respond = respond
    push = FakePush(lambda connection, subscription: until_closed(connection), reply=slow_reply)
    with job.api, push:
        Client(job.api.url, KEY, ws_url=push.url, sleep=time_.sleep, clock=time_.clock).wait(JOB_ID)
    # THEN its first read came after the reply: an end between the two is not lost
    assert push.replied_at and read_at and read_at[0] >= push.replied_at[0]


def test_a_subscription_the_api_refuses_makes_wait_poll():
    # GIVEN a WebSocket API that answers the subscription with an error
    time_, job = FakeTime(), Job("running")

    def respond(seen: Seen) -> Reply:
        if len(job.api.gets()) >= 2:
            job.status = "succeeded"
        return Job.respond(job, seen)

    job.api.respond = respond
    refuse = lambda subscription: '{"type": "error", "code": "invalid_subscription", "message": "job_ids.0: no"}'  # noqa: E731
    push = FakePush(lambda connection, subscription: until_closed(connection), reply=refuse)
    with job.api, push:
        final = Client(job.api.url, KEY, ws_url=push.url, sleep=time_.sleep, clock=time_.clock).wait(JOB_ID)
    # THEN it went on by polling (with sleeps between) and saw the end
    assert final.status is JobStatus.SUCCEEDED and time_.sleeps


def test_the_async_client_waits_for_the_subscription_reply_too():
    time_, job = FakeTime(), Job("succeeded")
    read_at: list[float] = []

    def slow_reply(subscription: dict[str, Any]) -> str:
        threading.Event().wait(0.5)
        return subscribed(subscription)

    def respond(seen: Seen) -> Reply:
        read_at.append(monotonic())
        return Job.respond(job, seen)

    job.api.respond = respond
    push = FakePush(lambda connection, subscription: until_closed(connection), reply=slow_reply)

    async def wait() -> JobStatus:
        async with AsyncClient(job.api.url, KEY, ws_url=push.url, sleep=time_.async_sleep, clock=time_.clock) as client:
            return (await client.wait(JOB_ID)).status

    with job.api, push:
        assert asyncio.run(wait()) is JobStatus.SUCCEEDED
    assert read_at[0] >= push.replied_at[0]
