"""Fair scheduling between tenants inside a worker: the admission gives a freed slot to the tenant holding fewest
(gpu_worker.lanes.Admission), and a tenant holds at most its share of the received messages (gpu_worker.fairness)."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

import pytest

from gpu_worker.fairness import (
    FAIR_SCAN_PAUSE_MAX_S,
    FAIR_SCAN_PAUSE_S,
    ScanPause,
    TenantShare,
    rows_held,
)
from gpu_worker.lanes import BATCH, INTERACTIVE, Admission, BatchBudget
from gpu_worker.worker import WorkerConfig


async def _noop_abort(request_id: str) -> None:
    return None


async def _hold(admission: Admission, lane: str, tenant: str, name: str, release: asyncio.Event, log: list[str]):
    async with admission.slot(lane, name, tenant=tenant):
        log.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize("lane", [INTERACTIVE, BATCH])
def test_a_freed_slot_goes_to_the_tenant_holding_fewest_not_to_the_oldest_waiter(lane: str):
    async def scenario() -> list[str]:
        # GIVEN an engine of 2 slots, both held by tenant A, and 5 more of A's requests waiting before one of B's
        admission = Admission(2, reserve=0, abort=_noop_abort)
        log: list[str] = []
        releases = {f"a{i}": asyncio.Event() for i in range(7)} | {"b0": asyncio.Event()}
        tasks = [
            asyncio.create_task(_hold(admission, lane, "tenant-a", f"a{i}", releases[f"a{i}"], log)) for i in range(7)
        ]
        await _settle()
        tasks.append(asyncio.create_task(_hold(admission, lane, "tenant-b", "b0", releases["b0"], log)))
        await _settle()
        # WHEN one of A's requests ends
        releases["a0"].set()
        await _settle()
        started = list(log)
        for release in releases.values():
            release.set()
        await asyncio.gather(*tasks)
        return started

    # THEN B's request has the freed slot, ahead of A's five older ones
    assert asyncio.run(scenario()) == ["a0", "a1", "b0"]


def test_among_tenants_holding_as_many_slots_the_oldest_waiter_goes_first():
    async def scenario() -> list[str]:
        # GIVEN one slot, held by C, and requests of A then B waiting (neither holds a slot)
        admission = Admission(1, reserve=0, abort=_noop_abort)
        log: list[str] = []
        release = asyncio.Event()
        first = asyncio.Event()
        tasks = [asyncio.create_task(_hold(admission, INTERACTIVE, "tenant-c", "c0", first, log))]
        await _settle()
        tasks += [
            asyncio.create_task(_hold(admission, INTERACTIVE, tenant, tenant[-1] + "0", release, log))
            for tenant in ("tenant-a", "tenant-b")
        ]
        await _settle()
        # WHEN the slot frees, and then every slot
        first.set()
        release.set()
        await asyncio.gather(*tasks)
        return log

    # THEN they run in arrival order
    assert asyncio.run(scenario()) == ["c0", "a0", "b0"]


@dataclass
class Received:
    tenant: str | None
    receive_count: int = 1
    rows: int = 1


def test_a_tenant_at_its_share_has_its_messages_requeued_and_others_kept():
    # GIVEN a share of 3 messages, tenant A holding 2 already
    share = TenantShare(3)
    received = [Received("a"), Received("a"), Received("b"), Received("a"), Received(None), Received("a", 2)]
    # WHEN 6 messages are received
    keep, requeue = share.split(received, collections.Counter({"a": 2}))
    # THEN A keeps one more (its third), the later ones are requeued, except one received before (its receive count
    # must not start over); B's and the message without a tenant are kept
    assert keep == [received[0], received[2], received[4], received[5]]
    assert requeue == [received[1], received[3]] and share.requeued == 2


def test_a_tenants_share_counts_the_engine_rows_of_its_messages_not_the_messages():
    # GIVEN a worker of 8 rows with a share of 12 (capacity plus prefetch), tenant A holding one request of n 8
    share = TenantShare(12)
    holding = rows_held([Received("a", rows=8)])
    # WHEN 40 more of A's n-8 requests are received, then B's one-row job
    received = [Received("a", rows=8) for _ in range(40)] + [Received("b")]
    keep, requeue = share.split(received, holding)
    # THEN A keeps one more (it held 8 rows, under its 12; then 16), the other 39 are requeued, and B's job is kept
    assert keep == [received[0], received[40]]
    assert len(requeue) == 39


@pytest.mark.parametrize(("capacity", "prefetch", "room"), [(2, 4, 2), (64, None, 16), (4, 1, 1), (4, 0, 1)])
def test_the_room_kept_for_other_tenants_is_half_the_prefetch_and_at_least_one(
    capacity: int, prefetch: int | None, room: int
):
    # GIVEN a worker of `capacity` slots and its prefetch (None: the default, 32 at 64 slots) WHEN its fair room is
    # asked THEN it is half the prefetch, at least one place
    config = WorkerConfig.model_construct(prefetch=prefetch)
    assert config.fair_room(capacity) == room


@dataclass
class HeldChunk:
    lines: int
    in_engine: bool = False


def test_the_batch_budget_says_when_it_takes_no_more_and_counts_the_scouts_messages():
    # GIVEN a batch-lane budget that wants 2 lines waiting, holding a chunk of 100 lines not yet in the engine
    held = [HeldChunk(100)]
    budget = BatchBudget(Admission(2, reserve=0, abort=_noop_abort), ahead=2, max_messages=10, held=lambda: held)
    # WHEN it is asked THEN it takes no more (the scout's turn); without the chunk, it would
    assert budget.saturated()
    held.clear()
    assert not budget.saturated()
    # AND a message the scout holds is counted until it is given back
    budget.add(1)
    assert budget.taken == 1
    asyncio.run(budget.give(1))
    assert budget.taken == 0


def test_the_scan_pause_doubles_while_only_tenants_at_their_share_turn_up_and_resets_when_one_is_held():
    # GIVEN the batch lane scout's pause WHEN looks keep finding only tenants at their share THEN it waits 0.5, 1, 2, 2 s
    pause = ScanPause()
    assert [pause.nothing() for _ in range(4)] == [FAIR_SCAN_PAUSE_S, 1.0, FAIR_SCAN_PAUSE_MAX_S, FAIR_SCAN_PAUSE_MAX_S]
    # WHEN a look finds a message to hold THEN the next pause is the shortest again
    pause.found()
    assert pause.nothing() == FAIR_SCAN_PAUSE_S
