"""Holding a request until its job ends: the wait behind the OpenAI routes (``POST /v1/chat/completions`` and the
others, lambdas/api/openai_routes.py) and behind ``POST /v1/jobs`` with ``Prefer: wait=N`` (RFC 7240).

The job runs as every job does (queue, lanes, quotas, wake, notifications); the API function only reads the job's
record until it is final, with a strongly consistent read that backs off from ``FIRST_POLL_S`` to ``MAX_POLL_S``. A
read is one DynamoDB read request unit (the record is under 4 KB), so a wait of the longest ``MAX_WAIT_S`` costs at
most about 60 reads; what a held request costs is the API function's time (docs/openai-routes.md).

``MAX_WAIT_S`` comes from the API function's timeout, which is API Gateway's integration timeout
(``settings.API_FUNCTION_TIMEOUT_S``): the wait ends early enough that the function still answers, with the job id,
before API Gateway would answer a bare 504 in its place.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from async_inference import settings
from async_inference.aws import JobStore
from async_inference.jobs import FINAL_STATES
from async_inference.schemas import Job

# Left of the function's timeout for what comes before the wait (the submission: S3 and DynamoDB writes, the queue
# send, a wake) and after it (the result's read from S3).
ANSWER_MARGIN_S = 4
MAX_WAIT_S = settings.API_FUNCTION_TIMEOUT_S - ANSWER_MARGIN_S
FIRST_POLL_S = 0.05
MAX_POLL_S = 0.5  # the most a held request's answer comes after its job ended
POLL_GROWTH = 1.5
PREFER_WAIT = "wait"


class JobWait:
    """Reads a job's record until it is final, or a wait runs out."""

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self._clock = clock
        self._sleep = sleep

    def until_final(self, job_id: str, wait_s: float) -> Job | None:
        """The job once it is final, or as it stands when ``wait_s`` seconds have passed; None for no such job."""
        deadline = self._clock() + max(0.0, wait_s)
        interval = FIRST_POLL_S
        while True:
            job = self.store.get(job_id)
            left_s = deadline - self._clock()
            if job is None or job.status in FINAL_STATES or left_s <= 0:
                return job
            self._sleep(min(interval, left_s))
            interval = min(interval * POLL_GROWTH, MAX_POLL_S)


def preferred_wait_s(prefer: str | None, *, maximum: float = MAX_WAIT_S) -> float | None:
    """The ``wait`` preference of a ``Prefer`` header (RFC 7240 section 4.3), capped at ``maximum``; ``wait`` without a
    value asks for the maximum (as Replicate reads it). None when the header asks no wait; a preference that is not a
    whole number of seconds is ignored, as RFC 7240 says a server may ignore any preference."""
    for preference in (prefer or "").split(","):
        token, _, _parameters = preference.partition(";")
        name, has_value, value = token.partition("=")
        if name.strip().lower() != PREFER_WAIT:
            continue
        if not has_value:
            return maximum
        value = value.strip().strip('"')
        if not value.isdigit():
            return None
        return min(float(value), maximum)
    return None
