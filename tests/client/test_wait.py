"""wait() by polling, against a real local HTTP server on a fake clock: the backoff between polls, the server's
Retry-After, the deadline, and what a ten-minute job costs in polls."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest

from async_inference_client import AsyncClient, Client, JobUpdate, WaitTimeout
from async_inference_client.models.jobs import JobStatus
from async_inference_client.retry import DEFAULT_POLL, Backoff
from tests.client.fake_api import JOB_ID, FakeApi, FakeTime, Reply, Seen, completion, job_view, succeeded_view

KEY = "test-key-0123456789abcdef"


class JobUntil:
    """The API of one job that runs until the fake clock reaches ``done_at``, then has succeeded."""

    def __init__(self, time: FakeTime, done_at: float, *, retry_after: str | None = None) -> None:
        self.time, self.done_at, self.retry_after = time, done_at, retry_after
        self.api = FakeApi(self.respond)

    def respond(self, seen: Seen) -> Reply:
        if seen.path.startswith("/results/"):
            return Reply(200, completion())
        if self.time.now >= self.done_at:
            return Reply(200, succeeded_view(self.api.url))
        headers = {"Retry-After": self.retry_after} if self.retry_after else {}
        return Reply(200, job_view("running"), headers)


def test_polls_back_off_from_one_second_up_to_a_twenty_second_cap():
    # GIVEN a job that runs for three minutes
    time = FakeTime()
    job = JobUntil(time, done_at=180)
    with job.api:
        # WHEN the client waits for it
        final = Client(job.api.url, KEY, sleep=time.sleep, clock=time.clock, ws_url="").wait(JOB_ID)
    # THEN it succeeded, and each wait was the schedule's nominal delay less at most a fifth: growing by 1.5x from
    # 1 s, then level at the 20 s cap
    assert final.status is JobStatus.SUCCEEDED
    nominal = [DEFAULT_POLL.nominal(i) for i in range(len(time.sleeps))]
    assert all(0.8 * n <= s <= n for s, n in zip(time.sleeps, nominal, strict=True)), list(
        zip(time.sleeps, nominal, strict=True)
    )
    assert nominal[:4] == [1.0, 1.5, 2.25, 3.375] and max(time.sleeps) <= 20.0
    assert all(n == 20.0 for n in nominal[8:])


def polls_for_a_job_of(seconds: float, schedule: Backoff = DEFAULT_POLL, seed: int = 0) -> int:
    time = FakeTime()
    job = JobUntil(time, done_at=seconds)
    with job.api:
        Client(job.api.url, KEY, sleep=time.sleep, clock=time.clock, rng=random.Random(seed), ws_url="").wait(
            JOB_ID, timeout_s=2 * seconds, poll=schedule
        )
    return len(job.api.gets())


def test_a_ten_minute_job_costs_about_40_polls_where_a_fixed_half_second_cost_1200():
    # GIVEN a job that takes ten minutes, waited for with the default schedule (ten jitter draws), and with the
    # 0.5 s fixed interval the CLI used before
    backed_off = [polls_for_a_job_of(600, seed=seed) for seed in range(10)]
    fixed = polls_for_a_job_of(600, Backoff(initial_s=0.5, multiplier=1.0, cap_s=0.5, jitter=0.0))
    # THEN the backoff polls it 40 or 41 times (async_inference_client.retry's docstring quotes this), the fixed interval
    # 1,201 times: 30 times the billed requests, each counted against the tenant's quota
    print(
        f"polls for a ten-minute job: {min(backed_off)}..{max(backed_off)} "
        f"(mean {statistics.mean(backed_off):.1f}) with DEFAULT_POLL, {fixed} at a fixed 0.5 s"
    )
    assert 39 <= min(backed_off) and max(backed_off) <= 42
    assert fixed == 1201


def test_a_retry_after_on_the_jobs_get_sets_the_next_poll():
    # GIVEN a server that asks for a poll every 7 s while the job runs
    time = FakeTime()
    job = JobUntil(time, done_at=30, retry_after="7")
    with job.api:
        Client(job.api.url, KEY, sleep=time.sleep, clock=time.clock, ws_url="").wait(JOB_ID)
    # THEN the client polled every 7 s, not on its own schedule
    assert time.sleeps == [7.0] * 5


def test_wait_gives_up_at_its_deadline_with_the_last_view_of_the_job():
    # GIVEN a job that never ends within the wait
    time = FakeTime()
    job = JobUntil(time, done_at=10**9)
    with job.api:
        # WHEN the client waits 30 s
        with pytest.raises(WaitTimeout) as gave_up:
            Client(job.api.url, KEY, sleep=time.sleep, clock=time.clock, ws_url="").wait(JOB_ID, timeout_s=30)
    # THEN it polled one last time at the deadline, not past it, and says what the job was doing
    assert time.now == 30.0
    assert gave_up.value.job.status is JobStatus.RUNNING
    assert str(gave_up.value) == f"job {JOB_ID} is still running after 30 s"


def test_on_update_sees_every_poll():
    time = FakeTime()
    views = iter([job_view("queued"), job_view("running"), job_view("running"), job_view("failed", error="boom")])
    updates: list[JobUpdate] = []
    with FakeApi(lambda seen: Reply(200, next(views))) as api:
        final = Client(api.url, KEY, sleep=time.sleep, clock=time.clock, ws_url="").wait(
            JOB_ID, on_update=updates.append
        )
    assert final.status is JobStatus.FAILED and final.error == "boom"
    assert [(u.status.value, u.via) for u in updates] == [
        ("queued", "poll"),
        ("running", "poll"),
        ("running", "poll"),
        ("failed", "poll"),
    ]
    assert updates[-1].job == final


def test_result_of_the_waited_job_comes_from_its_presigned_url_without_the_api_key():
    time = FakeTime()
    job = JobUntil(time, done_at=0)
    with job.api:
        client = Client(job.api.url, KEY, sleep=time.sleep, clock=time.clock, ws_url="")
        answer = client.result(client.wait(JOB_ID))
    assert answer.choices[0].message.content == "the answer" and answer.job_id == JOB_ID
    [fetch] = [s for s in job.api.seen if s.path.startswith("/results/")]
    assert "x-api-key" not in fetch.headers  # a presigned URL needs no key, and S3 must never see it


def test_the_async_client_polls_on_the_same_schedule():
    time = FakeTime()
    job = JobUntil(time, done_at=60)

    async def wait() -> JobStatus:
        async with AsyncClient(job.api.url, KEY, sleep=time.async_sleep, clock=time.clock, ws_url="") as client:
            return (await client.wait(JOB_ID)).status

    with job.api:
        assert asyncio.run(wait()) is JobStatus.SUCCEEDED
    nominal = [DEFAULT_POLL.nominal(i) for i in range(len(time.sleeps))]
    assert all(0.8 * n <= s <= n for s, n in zip(time.sleeps, nominal, strict=True))
    assert len(job.api.gets()) == len(time.sleeps) + 1
