"""The schedules themselves: exponential growth up to a cap, jitter within its bounds, Retry-After read both ways."""

from __future__ import annotations

import datetime as dt
import email.utils
import random

import pytest

from async_inference_client.retry import DEFAULT_POLL, POLL_FLOOR_S, Backoff, RetryPolicy, parse_retry_after, poll_delay


class FixedRandom(random.Random):
    """``random()`` always returns the same value: jitter becomes a known fraction."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_delays_grow_by_the_multiplier_up_to_the_cap():
    # GIVEN a schedule without jitter
    schedule = Backoff(initial_s=0.5, multiplier=2.0, cap_s=4.0, jitter=0.0)
    # WHEN its first delays are drawn
    delays = [schedule.delay(attempt, random.Random(1)) for attempt in range(6)]
    # THEN they double from 0.5 s and stay at the cap
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_late_attempt_is_the_cap_without_overflowing():
    assert Backoff(initial_s=1.0, multiplier=10.0, cap_s=30.0).nominal(100_000) == 30.0


def test_full_jitter_spans_zero_to_the_nominal_delay():
    # GIVEN full jitter (the retry schedule's)
    schedule = Backoff(initial_s=1.0, multiplier=2.0, cap_s=8.0, jitter=1.0)
    # WHEN the random draw is at either end, or anywhere
    assert schedule.delay(2, FixedRandom(0.0)) == 4.0
    assert schedule.delay(2, FixedRandom(0.75)) == 1.0
    draws = [schedule.delay(2, rng) for rng in [random.Random(seed) for seed in range(200)]]
    # THEN every delay lies in [0, nominal], and they spread over that range
    assert all(0.0 <= d <= 4.0 for d in draws)
    assert min(draws) < 1.0 and max(draws) > 3.0


def test_poll_jitter_takes_at_most_a_fifth_off_each_delay():
    rng = random.Random(7)
    for attempt in range(20):
        nominal = DEFAULT_POLL.nominal(attempt)
        assert 0.8 * nominal <= DEFAULT_POLL.delay(attempt, rng) <= nominal


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"initial_s": 0}, "initial_s"),
        ({"initial_s": 1, "multiplier": 0.5}, "multiplier"),
        ({"initial_s": 2, "cap_s": 1}, "cap_s"),
        ({"initial_s": 1, "jitter": 1.5}, "jitter"),
    ],
)
def test_a_schedule_that_makes_no_sense_is_refused_naming_the_option(options, named):
    with pytest.raises(ValueError, match=named):
        Backoff(**options)


NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("3", 3.0),
        (" 120 ", 120.0),
        ("0", 0.0),
        ("1.5", 1.5),
        (email.utils.format_datetime(NOW + dt.timedelta(seconds=45), usegmt=True), 45.0),
        (email.utils.format_datetime(NOW - dt.timedelta(seconds=45), usegmt=True), 0.0),  # already past: now
        ("Tue, 01 Dec 2026 12:00:30 -0000", 30.0),
    ],
)
def test_retry_after_is_read_as_seconds_or_as_an_http_date(header, seconds):
    assert parse_retry_after(header, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("header", [None, "", "soon", "-5", "nan", "inf"])
def test_a_missing_or_unreadable_retry_after_is_none(header):
    assert parse_retry_after(header, now=NOW) is None


def test_retry_policy_takes_the_servers_delay_and_stops_after_max_retries():
    policy = RetryPolicy(max_retries=2)
    assert policy.delay(0, retry_after=7.0, rng=FixedRandom(0.5)) == 7.0
    assert policy.delay(1, retry_after=None, rng=FixedRandom(0.5)) == policy.backoff.nominal(1) * 0.5
    assert policy.delay(2, retry_after=1.0, rng=FixedRandom(0.5)) is None


def test_retry_policy_does_not_sleep_through_a_retry_after_over_its_limit():
    assert RetryPolicy(max_retry_after_s=60).delay(0, retry_after=3600.0, rng=random.Random(0)) is None


def test_a_poll_honours_retry_after_but_never_below_the_floor():
    assert poll_delay(DEFAULT_POLL, 0, retry_after=12.0, rng=random.Random(0)) == 12.0
    assert poll_delay(DEFAULT_POLL, 0, retry_after=0.0, rng=random.Random(0)) == POLL_FLOOR_S
