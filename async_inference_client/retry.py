"""How long the client waits: before sending a refused request again, and between two polls of a job.

Both schedules are exponential with jitter and a cap, and both give way to the server's ``Retry-After`` when it sends
one. Every delay is drawn from a ``random.Random`` the caller passes, so tests can fix it.

Polls per job: on API Gateway every poll is a billed request that counts against the tenant's quota. With
``DEFAULT_POLL`` a job that takes ten minutes is polled about 40 times (40 or 41, depending on the jitter; a fixed
0.5 s interval polls it 1,200 times), and its end is seen at most ``DEFAULT_POLL.cap_s`` (20 s) late.
``tests/client/test_wait.py`` measures this. Over the WebSocket API the same job costs 2 GETs (one once subscribed,
one for the final view) plus one for each ``PUSH_CHECK_S`` (60 s) the socket stays silent: at most about 12.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import math
import random
from dataclasses import dataclass, field

# Statuses that mean "not now, try again": API Gateway's throttling and quota (429), and the API's "the queue is
# unavailable" (503; S3 answers SlowDown with 503 too).
RETRYABLE_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Backoff:
    """Delays growing by ``multiplier`` from ``initial_s`` up to ``cap_s``. Jitter takes a random part of up to
    ``jitter`` off each delay (1.0 is "full jitter": anywhere from 0 to the nominal delay; 0 is none), so that clients
    refused together do not come back together.
    """

    initial_s: float
    multiplier: float = 2.0
    cap_s: float = 30.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        if not self.initial_s > 0:
            raise ValueError(f"Backoff.initial_s must be > 0, got {self.initial_s}")
        if not self.multiplier >= 1:
            raise ValueError(f"Backoff.multiplier must be >= 1, got {self.multiplier}")
        if not self.cap_s >= self.initial_s:
            raise ValueError(f"Backoff.cap_s ({self.cap_s}) must be >= Backoff.initial_s ({self.initial_s})")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff.jitter must be between 0 and 1, got {self.jitter}")

    def nominal(self, attempt: int) -> float:
        """The delay before jitter for the ``attempt``-th wait (0-based)."""
        # Compared in logs: multiplier ** attempt overflows a float long before a long wait runs out of attempts.
        if attempt * math.log(self.multiplier) >= math.log(self.cap_s / self.initial_s):
            return self.cap_s
        return self.initial_s * self.multiplier**attempt

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The ``attempt``-th delay (0-based), jittered."""
        return self.nominal(attempt) * (1.0 - self.jitter * rng.random())


def parse_retry_after(value: str | None, *, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP-date); None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; parsedate gives a naive one for "-0000"
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - (now or dt.datetime.now(dt.UTC))).total_seconds())


@dataclass(frozen=True)
class RetryPolicy:
    """When the client sends a refused request again, and after how long.

    A response in ``statuses`` is retried up to ``max_retries`` times: after its ``Retry-After`` when it has one, else
    after ``backoff``'s next delay. A ``Retry-After`` longer than ``max_retry_after_s`` (an exhausted daily quota, say)
    is not slept through: the error goes back to the caller with its ``retry_after``. A request that never got an
    answer (connection refused or dropped, a timeout) is retried the same way only when sending it twice is safe; the
    client decides that (GET, PUT, and a POST with an Idempotency-Key).
    """

    max_retries: int = 4
    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=0.5, multiplier=2.0, cap_s=20.0, jitter=1.0))
    statuses: frozenset[int] = RETRYABLE_STATUSES
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"RetryPolicy.max_retries must be >= 0, got {self.max_retries}")

    def delay(self, attempt: int, *, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds to wait before sending again after the ``attempt``-th refusal (0-based); None: do not retry."""
        if attempt >= self.max_retries:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after_s else None
        return self.backoff.delay(attempt, rng)


# Polling a job until it is final: 1 s, 1.5 s, 2.25 s, ... up to 20 s, each up to 20% shorter. A server's Retry-After
# on the job's GET replaces the delay (never below POLL_FLOOR_S, never past the caller's deadline).
DEFAULT_POLL = Backoff(initial_s=1.0, multiplier=1.5, cap_s=20.0, jitter=0.2)
POLL_FLOOR_S = 0.2
# While the WebSocket is quiet this long, wait() checks the job with a GET: a push lost between the server and this
# client then costs at most this much delay, not the whole wait.
PUSH_CHECK_S = 60.0


def poll_delay(schedule: Backoff, attempt: int, *, retry_after: float | None, rng: random.Random) -> float:
    """Seconds until the next poll after the ``attempt``-th one (0-based)."""
    if retry_after is not None:
        return max(POLL_FLOOR_S, retry_after)
    return schedule.delay(attempt, rng)
