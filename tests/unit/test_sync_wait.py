"""The wait behind a held request (async_inference.sync_wait): its reads, its backoff, its end; and the Prefer header."""

from __future__ import annotations

import datetime as dt

import pytest

from async_inference import settings
from async_inference.jobs import JobStatus
from async_inference.schemas import Job
from async_inference.sync_wait import MAX_POLL_S, MAX_WAIT_S, JobWait, preferred_wait_s

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _job(status: JobStatus) -> Job:
    return Job(
        job_id="job_1",
        tenant="t",
        status=status,
        created_at=NOW,
        updated_at=NOW,
        request_bucket="b",
        request_key="k",
        deadline=NOW,
        timeout_s=1,
    )


class Store:
    """A job table whose record goes final after ``final_after`` reads; counts the reads."""

    def __init__(self, final_after: int | None) -> None:
        self.final_after = final_after
        self.reads = 0

    def get(self, job_id: str) -> Job | None:
        self.reads += 1
        done = self.final_after is not None and self.reads > self.final_after
        return _job(JobStatus.SUCCEEDED if done else JobStatus.RUNNING)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_wait_ends_at_the_read_that_finds_the_job_final():
    # GIVEN a job that is final at the fourth read WHEN waited on for up to 20 s THEN the fourth read ends the wait
    store, clock = Store(final_after=3), Clock()
    job = JobWait(store, clock=clock, sleep=clock.sleep).until_final("job_1", 20)  # type: ignore[arg-type]
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert store.reads == 4 and clock.now < 1


def test_the_reads_back_off_to_a_ceiling_and_the_wait_ends_when_its_time_is_over():
    # GIVEN a job that never ends WHEN waited on for 10 s THEN it is answered as it stands at 10 s
    store, clock = Store(final_after=None), Clock()
    job = JobWait(store, clock=clock, sleep=clock.sleep).until_final("job_1", 10)  # type: ignore[arg-type]
    assert job is not None and job.status is JobStatus.RUNNING and clock.now == pytest.approx(10)
    # AND the reads grew further apart up to the ceiling, so a long wait costs a bounded number of reads
    assert clock.sleeps == sorted(clock.sleeps[:-1]) + clock.sleeps[-1:] and max(clock.sleeps) == MAX_POLL_S
    assert store.reads <= 10 / MAX_POLL_S + 10


def test_the_longest_wait_ends_before_the_functions_timeout():
    assert 0 < MAX_WAIT_S < settings.API_FUNCTION_TIMEOUT_S


@pytest.mark.parametrize(
    ("header", "wait_s"),
    [
        (None, None),
        ("respond-async", None),
        ("wait=5", 5),
        ("respond-async, wait=10", 10),
        ("WAIT = 3", 3),
        ('wait="7"', 7),
        ("wait", MAX_WAIT_S),
        (f"wait={MAX_WAIT_S + 100}", MAX_WAIT_S),
        ("wait=soon", None),
        ("wait=-1", None),
    ],
)
def test_prefer_wait_is_read_as_rfc_7240_says(header, wait_s):
    assert preferred_wait_s(header) == wait_s
