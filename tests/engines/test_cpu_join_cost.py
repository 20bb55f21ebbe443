"""The CPU engine's joins into a running batch (gpu_worker.engines.cpu): a running row waits for other requests'
prefills at most a quarter as long as the engine has worked on it. Bookkeeping only: no model is loaded."""

from __future__ import annotations

import asyncio

import pytest

from gpu_worker.engines.cpu import CpuEngine
from gpu_worker.engines.cpu_batch import Row

PROMPT_TOKENS = 30
PREFILL_S_PER_TOKEN = 0.005  # a prompt of 30 tokens: 0.15 s
STEP_S = 0.05  # a decoding step


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def row(loop: asyncio.AbstractEventLoop, name: str, *, own_s: float = 0.0, stalled_s: float = 0.0) -> Row:
    return Row(
        request_id=f"{name}/0",
        prompt_ids=[1] * PROMPT_TOKENS,
        max_tokens=8,
        temperature=0.0,
        top_p=1.0,
        stops=[],
        generator=None,
        loop=loop,
        future=loop.create_future(),
        own_s=own_s,
        stalled_s=stalled_s,
    )


def engine_with_pending(*pending: Row) -> CpuEngine:
    engine = CpuEngine()
    engine._prefill_s_per_token = PREFILL_S_PER_TOKEN
    engine._pending.extend(pending)
    return engine


def test_a_request_does_not_join_rows_that_waited_for_other_prefills_a_quarter_as_long_as_they_ran(loop):
    # GIVEN a running row the engine worked on for 0.6 s, which waited 0.15 s for another request's prefill, and a
    # request whose prefill would take 0.15 s more
    running = [row(loop, "b", own_s=0.6, stalled_s=0.15)]
    engine = engine_with_pending(row(loop, "a2"))

    # WHEN the decoding loop looks for rows to join, THEN it takes none: the running row's wait would exceed a quarter
    # of its work
    assert engine._take_pending(7, running) == []

    # AND once the running row has decoded for 0.65 s more, the request joins
    running[0].own_s += 0.65
    assert [r.request_id for r in engine._take_pending(7, running)] == ["a2/0"]


def test_a_row_waits_for_no_prefill_longer_than_a_quarter_of_its_work(loop):
    # GIVEN a running row the engine worked on for 0.4 s (its prefill and a few steps), and a request whose prefill
    # would take 0.15 s
    running = [row(loop, "b", own_s=0.4)]
    engine = engine_with_pending(row(loop, "a1"))

    # WHEN the decoding loop looks for rows to join, THEN it takes none
    assert engine._take_pending(7, running) == []


def test_requests_join_as_far_as_the_running_rows_can_wait_in_the_order_they_came(loop):
    # GIVEN a running row that can wait 0.35 s, and three requests of 0.15 s of prefill each
    running = [row(loop, "b", own_s=1.4)]
    engine = engine_with_pending(row(loop, "a1"), row(loop, "a2"), row(loop, "a3"))

    # WHEN the loop looks for rows to join, THEN the first two join, and the third waits
    assert [r.request_id for r in engine._take_pending(7, running)] == ["a1/0", "a2/0"]
    assert [r.request_id for r in engine._pending] == ["a3/0"]


def test_requests_coming_one_by_one_do_not_stall_a_short_job(loop):
    # GIVEN a running 8-token row just prefilled (0.15 s), and another tenant's four requests of 0.15 s of prefill,
    # coming one after each of its steps (their schemas compiled one after the other: bench/attacks_stack.py's grammar)
    victim = row(loop, "b", own_s=0.15)
    engine = engine_with_pending()
    coming = [row(loop, f"a{i}") for i in range(4)]
    joined = []

    # WHEN the loop alternates a look for rows to join with a decoding step, for the victim's seven steps left
    for _ in range(7):
        if coming:
            engine._pending.append(coming.pop(0))
        joined += engine._take_pending(7, [victim])
        victim.own_s += STEP_S

    # THEN none joins while it runs (one prefill, 0.15 s, is more than a quarter of its whole work, 0.5 s); once it
    # has finished, all four join together
    assert joined == []
    assert len(engine._take_pending(7, [])) == 4


def test_an_empty_batch_takes_every_pending_request_up_to_its_room(loop):
    # GIVEN nothing running and requests whatever their prefill's length
    engine = engine_with_pending(*(row(loop, f"a{i}") for i in range(3)))
    engine._prefill_s_per_token = 100.0

    # WHEN the loop starts a batch, THEN it takes them all, up to the room it has
    assert len(engine._take_pending(2, [])) == 2
    assert len(engine._take_pending(2, [])) == 1


def test_a_row_being_aborted_does_not_hold_a_request_back(loop):
    # GIVEN a running row that cannot wait any more but is being aborted (its request preempted for the newcomer, or
    # cancelled), and a request pending
    aborted = row(loop, "a", own_s=0.2, stalled_s=0.2)
    aborted.aborted = True
    engine = engine_with_pending(row(loop, "b"))

    # WHEN the loop looks for rows to join, THEN the request joins: the aborted row leaves at this step
    assert [r.request_id for r in engine._take_pending(7, [aborted])] == ["b/0"]
