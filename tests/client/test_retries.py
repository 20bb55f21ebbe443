"""Refused requests against a real local HTTP server: 429 and 503 are sent again after the server's Retry-After, or
after an exponential backoff with jitter; other errors, and unsafe resends, are not. Sleeps are recorded, not slept."""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
from collections.abc import Iterator

import pytest

from async_inference_client import ApiError, ApiUnreachable, AsyncClient, Client
from async_inference_client.retry import RetryPolicy
from tests.client.fake_api import JOB_ID, FakeApi, FakeTime, Reply, job_view
from tests.client.test_backoff import FixedRandom

KEY = "test-key-0123456789abcdef"


def scripted(*replies: Reply) -> Iterator[Reply]:
    """The replies in order, then 200 with a job for ever."""
    yield from replies
    while True:
        yield Reply(200, job_view("queued"))


def serve(*replies: Reply) -> FakeApi:
    script = scripted(*replies)
    return FakeApi(lambda seen: next(script))


def test_429_and_503_are_sent_again_after_the_retry_after_they_carry():
    # GIVEN an API that answers 429 (Retry-After: 3), then 503 (Retry-After: 1), then the job
    time = FakeTime()
    with serve(
        Reply(429, {"message": "Too Many Requests"}, {"Retry-After": "3"}),
        Reply(503, {"error": {"code": "unavailable", "message": "retry"}}, {"Retry-After": "1"}),
    ) as api:
        # WHEN the client reads the job
        job = Client(api.url, KEY, sleep=time.sleep).get(JOB_ID)
    # THEN it waited exactly what the server asked, each time, and got the job on the third request
    assert job.job_id == JOB_ID and job.status == "queued"
    assert time.sleeps == [3.0, 1.0]
    assert len(api.seen) == 3 and all(s.headers["x-api-key"] == KEY for s in api.seen)


def test_refusals_without_retry_after_back_off_exponentially_with_jitter():
    # GIVEN an API that answers 503 three times without Retry-After, and a draw that takes half of each delay off
    time = FakeTime()
    with serve(*[Reply(503, {"error": {"code": "unavailable", "message": "retry"}})] * 3) as api:
        # WHEN the client reads the job
        Client(api.url, KEY, sleep=time.sleep, rng=FixedRandom(0.5)).get(JOB_ID)
    # THEN it waited half of 0.5 s, 1 s, 2 s: the default backoff doubling from 0.5 s, fully jittered
    assert time.sleeps == [0.25, 0.5, 1.0]


def test_a_retry_after_given_as_an_http_date_is_honoured():
    time = FakeTime()
    when = email.utils.format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30), usegmt=True)
    with serve(Reply(429, {"message": "slow down"}, {"Retry-After": when})) as api:
        Client(api.url, KEY, sleep=time.sleep).get(JOB_ID)
    # The date has a one-second resolution and the request took a moment: 28 to 30 s from the reply.
    assert len(time.sleeps) == 1 and 28.0 <= time.sleeps[0] <= 30.0


def test_a_retry_after_longer_than_the_policy_allows_goes_back_to_the_caller_at_once():
    # GIVEN an API whose quota is spent for the hour
    time = FakeTime()
    with serve(Reply(429, {"message": "Limit Exceeded"}, {"Retry-After": "3600"})) as api:
        # WHEN the client reads the job
        with pytest.raises(ApiError) as refused:
            Client(api.url, KEY, sleep=time.sleep).get(JOB_ID)
    # THEN it did not sleep an hour: the error says 429 and how long the server asked for
    assert refused.value.status == 429 and refused.value.retry_after == 3600.0
    assert time.sleeps == [] and len(api.seen) == 1


def test_retries_end_after_max_retries_with_the_last_error():
    time = FakeTime()
    with FakeApi(lambda seen: Reply(503, {"error": {"code": "unavailable", "message": "the queue is down"}})) as api:
        with pytest.raises(ApiError) as refused:
            Client(api.url, KEY, sleep=time.sleep, retry=RetryPolicy(max_retries=3)).get(JOB_ID)
    assert refused.value.status == 503 and refused.value.code == "unavailable"
    assert len(api.seen) == 4 and len(time.sleeps) == 3


def test_a_refused_submit_is_sent_again_with_the_same_body_and_idempotency_key():
    time = FakeTime()
    with serve(Reply(429, {"message": "Too Many Requests"}, {"Retry-After": "2"})) as api:
        Client(api.url, KEY, sleep=time.sleep).submit({"model": "m", "messages": []}, idempotency_key="once-1")
    first, second = api.seen
    assert first.json() == second.json() == {"metadata": {}, "request": {"model": "m", "messages": []}}
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == "once-1"


def test_other_errors_are_not_retried_and_carry_the_apis_code_and_message():
    time = FakeTime()
    body = {
        "error": {
            "code": "invalid_request",
            "message": "request.max_tokens: must be at most 4096",
            "details": [{"field": "request.max_tokens", "message": "must be at most 4096"}],
        }
    }
    with serve(Reply(400, body)) as api:
        with pytest.raises(ApiError) as refused:
            Client(api.url, KEY, sleep=time.sleep).submit({"model": "m", "messages": [], "max_tokens": 10**6})
    error = refused.value
    assert (error.status, error.code, error.message) == (
        400,
        "invalid_request",
        "request.max_tokens: must be at most 4096",
    )
    assert error.details == [{"field": "request.max_tokens", "message": "must be at most 4096"}]
    assert len(api.seen) == 1 and time.sleeps == []


def test_a_dropped_connection_is_retried_for_a_read():
    time = FakeTime()
    with serve(Reply.dropped()) as api:
        job = Client(api.url, KEY, sleep=time.sleep).get(JOB_ID)
    assert job.job_id == JOB_ID and len(api.seen) == 2 and len(time.sleeps) == 1


def test_a_dropped_connection_is_not_resent_for_a_submit_without_idempotency_key():
    # GIVEN an API that drops the connection of the first POST: the job may or may not have been created
    time = FakeTime()
    with serve(Reply.dropped()) as api:
        # WHEN the client submits without an Idempotency-Key
        with pytest.raises(ApiUnreachable):
            Client(api.url, KEY, sleep=time.sleep).submit({"model": "m", "messages": []})
    # THEN it did not send it again: a second job could be the result
    assert len(api.seen) == 1 and time.sleeps == []


def test_a_dropped_connection_is_resent_for_a_submit_with_idempotency_key():
    time = FakeTime()
    with serve(Reply.dropped()) as api:
        Client(api.url, KEY, sleep=time.sleep).submit({"model": "m", "messages": []}, idempotency_key="k-1")
    assert [s.method for s in api.seen] == ["POST", "POST"]


def test_the_async_client_is_sent_again_after_the_same_retry_after():
    time = FakeTime()

    async def read() -> str:
        async with AsyncClient(api.url, KEY, sleep=time.async_sleep) as client:
            return (await client.get(JOB_ID)).job_id

    with serve(
        Reply(429, {"message": "Too Many Requests"}, {"Retry-After": "4"}),
        Reply(503, {"error": {"code": "unavailable", "message": "retry"}}, {"Retry-After": "2"}),
    ) as api:
        assert asyncio.run(read()) == JOB_ID
    assert time.sleeps == [4.0, 2.0] and len(api.seen) == 3


def test_list_sends_its_filters_as_query_parameters_and_reads_the_page():
    with FakeApi(lambda seen: Reply(200, {"jobs": [job_view("failed")], "next": "token-2"})) as api:
        page = Client(api.url, KEY).list(status="failed", limit=5)
    assert [seen.path for seen in api.seen] == ["/v1/jobs?status=failed&limit=5"]
    assert [j.status for j in page.jobs] == ["failed"] and page.next == "token-2"
