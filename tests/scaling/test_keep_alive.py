"""The learned keep-alive (async_inference.keep_alive): the idle-time histogram, its bound and its fallback."""

from __future__ import annotations

import random

import pytest

from async_inference.keep_alive import KeepAlivePolicy, break_even_s, decide, idle_periods, jobs_a_cold_start_meets

# A cheap cold start, no wait priced, no alarm minutes: the break-even is the cold start's GPU alone (10 minutes).
PLAIN = KeepAlivePolicy(cold_start_s=120.0, cold_start_gpu_s=600.0, wait_price=0.0, alarm_s=0.0, fallback_s=0.0)


def arrivals(gaps: list[int], *, jobs: float = 1.0, tail: int = 0) -> list[float | None]:
    """One busy minute, then for each gap that many empty minutes and a busy one, then ``tail`` empty minutes."""
    minutes: list[float | None] = [jobs]
    for gap in gaps:
        minutes += [0.0] * gap + [jobs]
    return minutes + [0.0] * tail


def test_idle_periods_are_the_runs_of_empty_minutes_between_busy_ones():
    # GIVEN busy minutes with 0, 2 and 5 empty minutes between them WHEN reading the idle periods THEN those counts
    assert idle_periods([1, 3, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0]) == [0, 2, 5]


def test_a_minute_cloudwatch_has_nothing_for_counts_as_empty():
    # GIVEN a minute without a datapoint between two busy minutes WHEN reading the idle periods THEN it is idle
    assert idle_periods([1, None, 1]) == [1]


def test_short_pauses_keep_the_task_for_one_cold_starts_worth():
    # GIVEN twenty 2-minute idle periods, all shorter than a cold start's worth (10 minutes) WHEN deciding THEN the
    # seen pauses price every candidate alike, and the longest, B, is kept: a longer pause not yet seen costs it least
    decision = decide(PLAIN, arrivals([2] * 20))
    assert decision.source == "histogram"
    assert decision.keep_alive_s == decision.break_even_s == 600.0
    assert decision.idle_periods == 20


def test_pauses_far_longer_than_a_cold_start_is_worth_let_the_task_go_after_the_short_ones():
    # GIVEN ten 2-minute idle periods and ten of an hour WHEN deciding THEN the keep-alive covers the 2-minute ones
    # (a 2-minute pause lasted up to 3 minutes; 10 % margin) and no more: keeping warm into an hour-long pause costs
    # more than the cold start after it
    decision = decide(PLAIN, arrivals([2, 60] * 10))
    assert decision.keep_alive_s == pytest.approx(3 * 60 * 1.1)


def test_the_last_task_is_kept_until_the_idle_time_reaches_the_keep_alive():
    # GIVEN short and hour-long idle periods (a 3.3-minute keep-alive) WHEN the queue has been idle 2 minutes, then 4
    # THEN kept, then let go
    assert decide(PLAIN, arrivals([2, 60] * 10, tail=2)).keep_warm
    assert not decide(PLAIN, arrivals([2, 60] * 10, tail=4)).keep_warm


def test_the_alarms_own_minutes_come_off_the_keep_alive():
    # GIVEN a keep-alive alarm that waits 3 minutes after the decision WHEN idle 1 minute against a 3.3-minute
    # keep-alive THEN the task is let go now, so that it goes at the keep-alive and not 3 minutes later
    policy = KeepAlivePolicy(cold_start_s=120.0, cold_start_gpu_s=600.0, wait_price=0.0, alarm_s=180.0)
    assert not decide(policy, arrivals([2, 60] * 10, tail=1)).keep_warm


def test_idle_times_far_longer_than_a_cold_start_is_worth_are_not_waited_out():
    # GIVEN idle periods of 30 minutes and a cold start worth 10 minutes of a warm task WHEN deciding THEN the
    # keep-alive is the break-even (30 minutes warm cost more than 10 minutes and a cold start), not the percentile
    decision = decide(PLAIN, arrivals([30] * 6))
    assert decision.source == "histogram"
    assert decision.keep_alive_s == decision.break_even_s == 600.0


def test_while_few_idle_periods_are_known_the_keep_alive_is_the_break_even():
    # GIVEN two idle periods (fewer than the histogram needs) WHEN deciding THEN the keep-alive is B, the ski-rental
    # choice that needs no prediction
    decision = decide(PLAIN, arrivals([1, 1]))
    assert (decision.source, decision.keep_alive_s) == ("ski_rental", 600.0)


def test_a_queue_that_never_paused_falls_back_to_the_fixed_keep_alive():
    # GIVEN a queue busy every minute of the window, now idle WHEN deciding THEN there is no idle time to learn from:
    # the keep-alive is the fixed fallback, and the last task is let go to the alarm's own minutes
    policy = KeepAlivePolicy(cold_start_s=120.0, cold_start_gpu_s=600.0, alarm_s=180.0, fallback_s=180.0)
    decision = decide(policy, [5.0] * 100 + [0.0])
    assert (decision.source, decision.keep_alive_s, decision.keep_warm) == ("fallback", 180.0, False)


def test_idle_periods_shorter_than_twice_a_cold_start_are_kept_warm_through():
    # GIVEN idle periods of 1 to 15 minutes and a cold start worth 10 minutes WHEN deciding THEN the keep-alive outlasts
    # the longest (releasing at 10 minutes and paying 10 more would cost more than keeping warm through any of them)
    decision = decide(PLAIN, arrivals(list(range(1, 16)) * 2))
    assert decision.keep_alive_s >= 16 * 60 > decision.break_even_s


def test_the_wait_of_the_jobs_a_cold_start_meets_raises_the_break_even():
    # GIVEN the same gaps, after which 50 jobs or half a job arrive in the cold start's two minutes WHEN pricing a
    # cold start THEN the many jobs' wait (50 x 60 s at 0.01 GPU-s a second = 30 GPU-s) is added to its GPU
    priced = KeepAlivePolicy(cold_start_s=120.0, cold_start_gpu_s=600.0, wait_price=0.01, alarm_s=0.0)
    many, one = arrivals([5] * 6, jobs=50), arrivals([5] * 6, jobs=0.5)
    assert jobs_a_cold_start_meets(many, 120.0) == pytest.approx(50.0)
    assert break_even_s(priced, many) == pytest.approx(600.0 + 0.01 * 50 * 60)
    assert break_even_s(priced, many) > break_even_s(priced, one)


def test_minutes_not_yet_published_do_not_count_as_idle():
    # GIVEN two busy minutes then five minutes CloudWatch has not published WHEN deciding THEN the idle time is 0
    decision = decide(PLAIN, [*arrivals([2, 60] * 10), None, None, None, None, None])
    assert decision.idle_s == 0.0
    assert decision.keep_warm


def test_no_arrival_in_the_window_keeps_nothing():
    # GIVEN four hours without a message WHEN deciding THEN the last task may go
    assert not decide(PLAIN, [0.0] * 240).keep_warm


def test_only_the_window_is_read():
    # GIVEN thirty 1-minute gaps five hours ago and a quiet trickle in the last four hours WHEN deciding THEN the old
    # gaps are not in the histogram
    old = arrivals([1] * 30)
    recent = arrivals([40] * 5, tail=34)  # 240 minutes
    decision = decide(PLAIN, old + recent)
    assert decision.idle_periods == 5


def test_the_learned_keep_alive_never_costs_more_on_the_arrivals_seen_than_the_ski_rental_rule():
    # GIVEN arrivals drawn at random (seeded) WHEN deciding THEN keeping warm for the learned keep-alive would have cost
    # no more over the idle periods seen than keeping warm for B, which costs at most twice the best
    rng = random.Random(29)
    for _ in range(200):
        gaps = [rng.choice([rng.randint(1, 5), rng.randint(1, 60)]) for _ in range(rng.randint(5, 40))]
        policy = KeepAlivePolicy(
            cold_start_s=rng.uniform(30, 600),
            cold_start_gpu_s=rng.uniform(0, 1200),
            wait_price=rng.uniform(0, 0.1),
            window_minutes=10_000,  # every idle period drawn in the window
        )
        decision = decide(policy, arrivals(gaps))
        lasted = [(g + 1) * 60 for g in gaps]

        def cost(keep_alive, bound=decision.break_even_s, lasted=lasted):
            return sum(t if t <= keep_alive else keep_alive + bound for t in lasted)

        assert cost(decision.keep_alive_s) <= cost(decision.break_even_s) + 1.0
        assert cost(decision.break_even_s) <= 2 * sum(min(t, decision.break_even_s) for t in lasted) + 1.0


@pytest.mark.parametrize(
    "change",
    [dict(low_percentile=90, high_percentile=50), dict(high_percentile=101), dict(wait_price=-1), dict(alarm_s=-1)],
)
def test_settings_that_cannot_decide_are_refused(change):
    # GIVEN settings with a percentile out of order or range, or a negative price WHEN building the policy THEN a
    # ValueError names them
    with pytest.raises(ValueError, match="|".join(change)):
        KeepAlivePolicy(**change)


def test_the_policy_travels_as_json():
    # GIVEN a policy WHEN written to JSON and read back (the function's environment) THEN it is the same policy
    policy = KeepAlivePolicy(cold_start_s=99.0, wait_price=0.5, window_minutes=60)
    assert KeepAlivePolicy.from_json(policy.to_json()) == policy
