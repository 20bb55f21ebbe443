"""The two lanes' admission (gpu_worker.lanes): interactive jobs first, a reserve, preemption of batch lines."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from async_inference import settings
from gpu_worker.engines.base import GenerationAborted
from gpu_worker.engines.simulated import SimulatedEngine
from gpu_worker.lanes import BATCH, INTERACTIVE, Admission, BatchBudget, default_reserve


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class Aborts:
    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, request_id: str) -> None:
        self.ids.append(request_id)


async def hold(admission: Admission, lane: str, request_id: str, release: asyncio.Event, log: list[str]) -> None:
    async with admission.slot(lane, request_id) as slot:
        log.append(request_id)
        await release.wait()
        assert slot.lane == lane


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_batch_lines_leave_the_reserve_free():
    async def scenario() -> tuple[list[str], dict[str, int], int]:
        # GIVEN an engine of 4 slots with 1 reserved for interactive jobs
        admission, release, log = Admission(4, reserve=1, abort=Aborts()), asyncio.Event(), []
        # WHEN 5 batch lines ask for slots
        tasks = [asyncio.create_task(hold(admission, BATCH, f"b{i}", release, log)) for i in range(5)]
        await settle()
        state = (list(log), admission.in_engine, admission.free)
        release.set()
        await asyncio.gather(*tasks)
        return state

    started, in_engine, free = run(scenario())
    # THEN 3 run, in order, and one slot stays free
    assert started == ["b0", "b1", "b2"]
    assert in_engine == {INTERACTIVE: 0, BATCH: 3} and free == 1


def test_an_interactive_job_takes_the_reserved_slot_at_once_without_preempting():
    async def scenario() -> tuple[list[str], list[str]]:
        aborts = Aborts()
        admission, release, log = Admission(4, reserve=1, abort=aborts), asyncio.Event(), []
        batch = [asyncio.create_task(hold(admission, BATCH, f"b{i}", release, log)) for i in range(4)]
        await settle()
        # WHEN an interactive job arrives while batch lines fill all but the reserve
        job = asyncio.create_task(hold(admission, INTERACTIVE, "job", release, log))
        await settle()
        state = list(log)
        release.set()
        await asyncio.gather(*batch, job)
        return state, aborts.ids

    started, aborted = run(scenario())
    # THEN it runs at once, and no batch line was aborted for it
    assert started == ["b0", "b1", "b2", "job"]
    assert aborted == []


def test_an_interactive_job_preempts_the_youngest_batch_line_when_no_slot_is_free():
    async def scenario() -> tuple[list[str], list[str], list[str], int]:
        aborts = Aborts()
        # GIVEN a full engine: 2 slots, no reserve, both running batch lines (b0 older than b1)
        admission, log = Admission(2, reserve=0, abort=aborts), []
        preempted: list[str] = []
        released = {name: asyncio.Event() for name in ("b0", "b1", "job")}

        async def batch_line(name: str) -> None:
            async with admission.slot(BATCH, name) as slot:
                log.append(name)
                while not slot.preempted and not released[name].is_set():
                    await asyncio.sleep(0)
                if slot.preempted:
                    preempted.append(name)

        lines = [asyncio.create_task(batch_line("b0")), asyncio.create_task(batch_line("b1"))]
        await settle()
        # WHEN an interactive job asks for a slot
        job = asyncio.create_task(hold(admission, INTERACTIVE, "job", released["job"], log))
        await settle()
        state = list(log)
        for event in released.values():
            event.set()
        await asyncio.gather(*lines, job)
        return state, aborts.ids, preempted, admission.preemptions

    started, aborted, preempted, count = run(scenario())
    # THEN the younger batch line is aborted in the engine, and the job gets its slot; the older line runs on
    assert aborted == ["b1"] and preempted == ["b1"] and count == 1
    assert started == ["b0", "b1", "job"]


def test_no_batch_line_starts_while_an_interactive_job_waits():
    async def scenario() -> list[str]:
        admission, log = Admission(1, reserve=0, abort=Aborts()), []
        first, rest = asyncio.Event(), asyncio.Event()
        # GIVEN an engine of one slot held by an interactive job, a batch line waiting, then a second job waiting
        running = asyncio.create_task(hold(admission, INTERACTIVE, "job1", first, log))
        await settle()
        line = asyncio.create_task(hold(admission, BATCH, "b0", rest, log))
        await settle()
        job2 = asyncio.create_task(hold(admission, INTERACTIVE, "job2", rest, log))
        await settle()
        # WHEN the slot frees
        first.set()
        await settle()
        state = list(log)
        rest.set()
        await asyncio.gather(running, line, job2)
        return state + list(log[len(state) :])

    order = run(scenario())
    # THEN the second job goes before the batch line that waited longer
    assert order == ["job1", "job2", "b0"]


def test_a_preempted_line_asking_again_goes_first_in_the_batch_lane():
    async def scenario() -> list[str]:
        admission, log, release = Admission(1, reserve=0, abort=Aborts()), [], asyncio.Event()
        blocker = asyncio.create_task(hold(admission, INTERACTIVE, "job", release, log))
        await settle()
        waiting = [asyncio.create_task(hold(admission, BATCH, f"b{i}", release, log)) for i in range(2)]
        await settle()
        again = asyncio.create_task(hold_first(admission, "preempted", release, log))
        await settle()
        release.set()
        await asyncio.gather(blocker, *waiting, again)
        return log

    async def hold_first(admission: Admission, name: str, release: asyncio.Event, log: list[str]) -> None:
        async with admission.slot(BATCH, name, first=True):
            log.append(name)
            await release.wait()

    assert run(scenario()) == ["job", "preempted", "b0", "b1"]


def test_a_waiter_cancelled_before_its_turn_gives_up_its_place():
    async def scenario() -> tuple[dict[str, int], int, list[str]]:
        admission, log, release = Admission(1, reserve=0, abort=Aborts()), [], asyncio.Event()
        blocker = asyncio.create_task(hold(admission, INTERACTIVE, "job", release, log))
        await settle()
        doomed = asyncio.create_task(hold(admission, BATCH, "doomed", release, log))
        after = asyncio.create_task(hold(admission, BATCH, "after", release, log))
        await settle()
        # WHEN a waiting line is cancelled (its batch was cancelled, or it expired)
        doomed.cancel()
        await settle()
        waiting = admission.batch_waiting
        release.set()
        await asyncio.gather(blocker, after)
        return admission.in_engine, waiting, log

    in_engine, waiting, log = run(scenario())
    # THEN it is no longer waiting, the line after it runs, and every slot is given back
    assert waiting == 1
    assert log == ["job", "after"]
    assert in_engine == {INTERACTIVE: 0, BATCH: 0}


def test_async_with_takes_an_interactive_slot_as_the_semaphore_did():
    async def scenario() -> tuple[dict[str, int], dict[str, int]]:
        admission = Admission(2, reserve=1, abort=Aborts())
        async with admission:
            inside = admission.in_engine
        return inside, admission.in_engine

    inside, after = run(scenario())
    assert inside == {INTERACTIVE: 1, BATCH: 0} and after == {INTERACTIVE: 0, BATCH: 0}


@pytest.mark.parametrize("reserve", [-1, 4])
def test_a_reserve_that_leaves_batch_lines_no_slot_is_refused(reserve: int):
    with pytest.raises(ValueError, match="interactive reserve must be 0 to 3"):
        Admission(4, reserve=reserve, abort=Aborts())


def test_the_default_reserve_is_one_slot_in_64_and_at_least_one():
    assert [default_reserve(c) for c in (1, 2, 64, 256)] == [0, 1, 1, 4]


# Counted in the engine's steps, not in seconds: a loaded host stretches a step, not the count.
STEP_S = 0.1


def test_on_a_simulated_engine_an_interactive_job_starts_within_one_step_of_a_full_batch():
    """The bound the worker states: with every slot held by batch lines, an interactive request starts generating
    within one engine step (the youngest line is aborted for it) and ends after its own tokens only."""

    async def scenario() -> tuple[int, int, int]:
        engine = SimulatedEngine(capacity=4, step_s=STEP_S)
        await engine.start()
        admission = Admission(4, reserve=0, abort=engine.abort)
        from async_inference.schemas import ChatCompletionRequest

        def request(tokens: int) -> ChatCompletionRequest:
            return ChatCompletionRequest(
                model="sim", messages=[{"role": "user", "content": "w " * tokens}], max_tokens=tokens
            )

        async def batch_line(i: int) -> None:
            first = False
            while True:
                async with admission.slot(BATCH, f"line-{i}", first=first) as slot:
                    try:
                        await engine.generate(f"line-{i}", request(500))
                        return
                    except GenerationAborted:
                        if not slot.preempted:
                            raise
                first = True

        lines = [asyncio.create_task(batch_line(i)) for i in range(6)]
        await asyncio.sleep(5 * STEP_S)
        asked = engine.stats.steps
        async with admission:
            started = engine.stats.steps
            await engine.generate("job", request(3))
            ended = engine.stats.steps
        for line in lines:
            line.cancel()
        await asyncio.gather(*lines, return_exceptions=True)
        await engine.close()
        return started - asked, ended - asked, admission.preemptions

    wait_steps, total_steps, preemptions = run(scenario())
    # THEN it got a slot within one step (a batch line was preempted), and finished in its own 3 steps (+1 to enter)
    assert preemptions == 1
    assert wait_steps <= 1
    assert total_steps <= 3 + 1 + 1


@dataclass
class Held:
    lines: int
    in_engine: bool


def test_the_batch_budget_asks_for_one_chunk_at_a_time_and_ten_single_jobs():
    async def scenario() -> tuple[int, int, int]:
        admission = Admission(64, reserve=1, abort=Aborts())
        held: list[Held] = []
        budget = BatchBudget(admission, ahead=64, max_messages=128, held=lambda: held)
        # nothing held: one chunk's worth
        first = await budget.take(10)
        # a chunk held and not yet read (its 100 lines are "waiting"): take waits; once in the engine, one more
        held.append(Held(settings.BATCH_CHUNK_LINES, in_engine=False))
        waiter = asyncio.create_task(budget.take(10))
        await asyncio.sleep(0.1)
        blocked = not waiter.done()
        held[0].in_engine = True
        second = await waiter
        # single jobs held (1 line each, all in the engine): ask for ten at once
        held[:] = [Held(1, in_engine=True) for _ in range(5)]
        third = await budget.take(10)
        assert blocked
        return first, second, third

    assert run(scenario()) == (1, 1, 10)


def test_the_batch_budget_stops_asking_once_the_worker_stops():
    async def scenario() -> int:
        admission = Admission(4, reserve=0, abort=Aborts())
        budget = BatchBudget(admission, ahead=4, max_messages=8, held=lambda: [Held(100, False)], stopping=lambda: True)
        return await asyncio.wait_for(budget.take(10), timeout=1)

    assert run(scenario()) == 0


def test_slots_count_engine_rows_so_one_tenants_n_8_requests_cannot_fill_the_engine_ahead_of_another():
    async def scenario() -> tuple[list[str], int]:
        # GIVEN an engine of 8 rows, and tenant a's 5 requests of n: 8 (40 rows) waiting for it
        admission, release, log = Admission(8, reserve=1, abort=Aborts()), {}, []
        most_rows = 0

        async def request(tenant: str, request_id: str, rows: int) -> None:
            nonlocal most_rows
            release[request_id] = asyncio.Event()
            async with admission.slot(INTERACTIVE, request_id, tenant=tenant, rows=rows, max_tokens=16):
                log.append(request_id)
                most_rows = max(most_rows, admission.in_engine[INTERACTIVE])
                await release[request_id].wait()

        tasks = [asyncio.create_task(request("a", f"a{i}", 8)) for i in range(5)]
        await settle()
        # WHEN tenant b's one-row request arrives, and then the requests end one by one
        tasks.append(asyncio.create_task(request("b", "b0", 1)))
        await settle()
        for _ in range(6):
            for event in release.values():
                event.set()
            await settle()
        await asyncio.gather(*tasks)
        return log, most_rows

    log, most_rows = run(scenario())
    # THEN a's requests run one at a time (8 rows each), b's runs next after the first, and no more rows than the
    # engine has were ever handed out
    assert log[:2] == ["a0", "b0"]
    assert most_rows == 8


def test_a_request_wider_than_the_engine_takes_all_of_it():
    async def scenario() -> int:
        admission = Admission(4, reserve=1, abort=Aborts())
        async with admission.slot(INTERACTIVE, "wide", rows=16):
            return admission.free

    assert run(scenario()) == 0


async def _hold_until(admission: Admission, tenant: str, request_id: str, rows: int, log: list[str]) -> None:
    """Hold slots until aborted (the preempted flag set by the admission), as the runner does with a generation."""
    async with admission.slot(INTERACTIVE, request_id, tenant=tenant, rows=rows) as slot:
        log.append(f"start {request_id}")
        while not slot.preempted:
            await asyncio.sleep(0.001)
        log.append(f"preempted {request_id}")


def test_a_tenant_holding_more_than_half_the_engine_has_its_youngest_request_preempted_for_a_tenant_holding_none():
    async def scenario() -> tuple[list[str], list[str]]:
        # GIVEN tenant a's request holding all 8 rows of the engine
        aborts, log = Aborts(), []
        admission = Admission(8, reserve=1, abort=aborts)
        a = asyncio.create_task(_hold_until(admission, "a", "a0", 8, log))
        await settle()
        # WHEN tenant b's one-row request waits
        release = asyncio.Event()
        b = asyncio.create_task(hold(admission, INTERACTIVE, "b0", release, log))
        await asyncio.wait_for(a, 1)
        await settle()
        release.set()
        await b
        return log, aborts.ids

    log, aborted = run(scenario())
    # THEN a's request is aborted in the engine and b's starts once its rows are let go
    assert aborted == ["a0"]
    assert log == ["start a0", "preempted a0", "b0"]


def test_a_tenant_holding_half_the_engine_or_less_is_not_preempted():
    async def scenario() -> list[str]:
        # GIVEN tenants a and c holding 4 rows each of an engine of 8
        aborts, log, release = Aborts(), [], asyncio.Event()
        admission = Admission(8, reserve=1, abort=aborts)

        async def hold_as(tenant: str, request_id: str, rows: int) -> None:
            async with admission.slot(INTERACTIVE, request_id, tenant=tenant, rows=rows):
                log.append(request_id)
                await release.wait()

        held = [asyncio.create_task(hold_as("a", "a0", 4)), asyncio.create_task(hold_as("c", "c0", 4))]
        await settle()
        # WHEN tenant b's request waits
        held.append(asyncio.create_task(hold_as("b", "b0", 1)))
        await settle()
        aborted = list(aborts.ids)
        release.set()
        await asyncio.gather(*held)
        return aborted

    # THEN nobody is preempted: b waits for the next rows that free
    assert run(scenario()) == []


def test_slots_taken_with_async_with_are_all_let_go():
    async def scenario() -> int:
        admission = Admission(4, reserve=1, abort=Aborts())
        async with admission, admission:
            pass
        return len(admission._running)

    assert run(scenario()) == 0
