"""The two lanes: who gets the engine's slots, interactive jobs first (docs/design/batches.md, "The two lanes").

A worker receives from the job queue (the interactive lane) and, when it has one, from the batch-lane queue (batch
chunks, and single jobs submitted with ``priority: "batch"``). Both lanes share the engine's ``capacity`` slots
through one ``Admission``:

* an interactive job takes any free slot;
* a batch line takes a slot only while no interactive job waits for one and more than ``reserve`` slots are free, so
  the last ``reserve`` slots are left for the next interactive job;
* an interactive job that finds no free slot preempts the youngest batch line (the one that has generated least):
  that line is aborted in the engine and waits again, at the head of the batch lane, to run from the start.

So a batch never puts an interactive job behind it: an interactive job that reaches the engine starts within one
engine step (a free reserved slot, or one freed by an abort). Interactive jobs can fill the engine against another
tenant's interactive job only up to half of it: a tenant holding more than half of the engine's rows has its youngest
interactive request preempted (aborted, asking again at the head of the lane) when a request of a tenant holding none
waits without the rows it needs. With the batch lane alone, the engine runs ``capacity - reserve`` lines at once.

Slots are counted in engine rows, not requests: a request asking for ``n`` choices is ``n`` rows of the engine's
batch (``capacity`` is rows), and takes ``n`` slots (all of them when ``n`` exceeds the capacity). Counted in
requests, 40 requests of one tenant with ``n: 8`` filled the engine's own queue eight times over, and another tenant's
8-token job, admitted after the first few of them, waited 80 s behind 33 of them in the engine.

Within a lane, freed slots go to the waiting request whose tenant holds the fewest rows of that lane, then the fewest
tokens (its requests' rows times their ``max_tokens``: what they may still cost), then has the fewest rows waiting (a
tenant's backlog goes after another's single request when both hold nothing), the oldest among those (a preempted
request asking again keeps its place at the head); a request waits until it has all its rows, and the requests behind
it in that order wait with it, so a large request is not starved by small ones. A tenant whose many requests wait here
cannot keep another tenant's request waiting for longer than the rows it holds take to free (docs/security.md, "Fair
scheduling").

``BatchBudget`` decides how many batch-lane messages to ask SQS for: enough that about one engine's worth of lines
waits for slots, so the engine never runs dry between chunks, and no more, so that a batch's chunks spread over the
fleet instead of collecting in one worker.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from async_inference import settings

INTERACTIVE = "interactive"
BATCH = "batch"
LANES = (INTERACTIVE, BATCH)


def default_reserve(capacity: int) -> int:
    """Engine slots kept free for interactive jobs unless set: one in 64 (at least one, and never all of them).
    Each reserved slot costs the batch lane 1/capacity of the engine; a job arriving when none is free preempts."""
    return max(0, min(capacity - 1, max(1, capacity // 64)))


@dataclass(eq=False)
class Slot:
    """The engine slots (rows) held by one request. ``preempted`` is set when the admission aborted the request to
    give its slots to an interactive job: the holder lets them go and asks again."""

    lane: str
    request_id: str
    preempted: bool = False
    tenant: str = ""
    first: bool = False  # asks again after a preemption: waits at the head of its lane
    rows: int = 1  # engine rows: the request's n, at most the capacity
    tokens: int = 0  # the most tokens its rows may generate (rows x max_tokens), for the fair order


class Admission:
    """The engine's slots, shared by the two lanes (the policy in this module's docstring).

    ``async with admission:`` takes an interactive slot, as the semaphore it replaces did; ``admission.slot(lane,
    request_id)`` takes a slot in either lane and yields the ``Slot``. ``abort`` is the engine's abort, called with
    the request id of a preempted batch line.
    """

    def __init__(self, capacity: int, *, reserve: int, abort: Callable[[str], Coroutine[Any, Any, None]]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not 0 <= reserve < capacity:
            raise ValueError(f"the interactive reserve must be 0 to {capacity - 1} (capacity - 1), got {reserve}")
        self.capacity = capacity
        self.reserve = reserve
        self._abort = abort
        self._interactive = 0  # interactive rows held
        self._running: dict[Slot, None] = {}  # interactive slots held, oldest first
        self._anonymous: list[Slot] = []  # those taken by ``async with``
        self._batch: dict[Slot, None] = {}  # batch slots held, oldest first
        self._waiting: dict[str, collections.deque[tuple[asyncio.Future[None], Slot]]] = {
            lane: collections.deque() for lane in LANES
        }
        self._preempting = 0  # rows of preempted slots not yet let go
        self._held: dict[str, collections.Counter[str]] = {lane: collections.Counter() for lane in LANES}  # rows
        self._held_tokens: dict[str, collections.Counter[str]] = {lane: collections.Counter() for lane in LANES}
        self._aborts: set[asyncio.Task[None]] = set()
        self.preemptions = 0  # batch requests aborted for an interactive job, since start

    # --- what the lanes see ---------------------------------------------------------------------------------------

    @property
    def free(self) -> int:
        """Engine rows no request holds."""
        return self.capacity - self._interactive - self._batch_rows

    @property
    def _batch_rows(self) -> int:
        return sum(slot.rows for slot in self._batch)

    @property
    def in_engine(self) -> dict[str, int]:
        """Engine rows held, by lane."""
        return {INTERACTIVE: self._interactive, BATCH: self._batch_rows}

    @property
    def batch_waiting(self) -> int:
        """Batch requests waiting for a slot."""
        return len(self._waiting[BATCH])

    @property
    def interactive_waiting(self) -> int:
        return len(self._waiting[INTERACTIVE])

    # --- taking and giving slots ----------------------------------------------------------------------------------

    async def __aenter__(self) -> None:
        slot = Slot(INTERACTIVE, "")
        await self._acquire(slot)
        self._anonymous.append(slot)

    async def __aexit__(self, *exc: object) -> None:
        self._release(self._anonymous.pop())  # any of them: they are alike

    @asynccontextmanager
    async def slot(
        self,
        lane: str,
        request_id: str,
        *,
        first: bool = False,
        tenant: str = "",
        rows: int = 1,
        max_tokens: int = 0,
    ) -> AsyncIterator[Slot]:
        """Hold the engine slots of ``lane`` for ``request_id`` of ``tenant``: ``rows`` of them (its ``n``; at most
        the capacity), each generating up to ``max_tokens``. ``first``: wait at the head of the lane (a preempted
        request asking again keeps its place)."""
        if lane not in LANES:
            raise ValueError(f"lane {lane!r} is not one of {LANES}")
        rows = max(1, min(rows, self.capacity))
        held = Slot(lane, request_id, tenant=tenant, first=first, rows=rows, tokens=rows * max(0, max_tokens))
        await self._acquire(held, first=first)
        try:
            yield held
        finally:
            self._release(held)

    def _may_start(self, slot: Slot) -> bool:
        if slot.lane == INTERACTIVE:
            return self.free >= slot.rows
        # A request wider than capacity - reserve may start only into an empty engine, or it could never start.
        room = self.free - self.reserve if self.free < self.capacity else self.capacity
        return room >= slot.rows and not self._waiting[INTERACTIVE]

    async def _acquire(self, slot: Slot, *, first: bool = False) -> None:
        waiting = self._waiting[slot.lane]
        if not waiting and self._may_start(slot):
            self._grant(slot)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (future, slot)
        if first:
            waiting.appendleft(entry)
        else:
            waiting.append(entry)
        self._preempt()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(slot)  # granted, but its holder was cancelled before it could use the slot
            else:
                try:
                    waiting.remove(entry)
                except ValueError:
                    pass
                self._dispatch()
            raise

    def _grant(self, slot: Slot) -> None:
        self._held[slot.lane][slot.tenant] += slot.rows
        self._held_tokens[slot.lane][slot.tenant] += slot.tokens
        if slot.lane == INTERACTIVE:
            self._interactive += slot.rows
            self._running[slot] = None
        else:
            self._batch[slot] = None

    def _release(self, slot: Slot) -> None:
        for held, amount in ((self._held[slot.lane], slot.rows), (self._held_tokens[slot.lane], slot.tokens)):
            held[slot.tenant] -= amount
            if held[slot.tenant] <= 0:
                del held[slot.tenant]
        if slot.lane == INTERACTIVE:
            self._interactive -= slot.rows
            self._running.pop(slot, None)
        else:
            self._batch.pop(slot, None)
        if slot.preempted:
            self._preempting -= slot.rows
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiters, interactive ones first; preempt for interactive waiters left without one."""
        for lane in LANES:
            waiting = self._waiting[lane]
            while waiting:
                index = self._next(lane)
                future, slot = waiting[index]
                if future.done():  # its waiter was cancelled
                    del waiting[index]
                    continue
                if not self._may_start(slot):
                    break  # it waits for all its rows, and those behind it in the fair order wait with it
                del waiting[index]
                self._grant(slot)
                future.set_result(None)
        self._preempt()

    def _next(self, lane: str) -> int:
        """Where in ``lane``'s waiters is the one freed slots go to: a preempted request asking again (at the head),
        else the oldest of the tenant that holds the fewest of the lane's rows, then tokens, then has the fewest rows
        waiting (one pass over those waiting: at most the worker's held messages, or a chunk's lines)."""
        waiting = self._waiting[lane]
        if waiting[0][1].first or len(waiting) == 1:
            return 0
        rows, tokens = self._held[lane], self._held_tokens[lane]
        backlog: collections.Counter[str] = collections.Counter()
        for _, slot in waiting:
            backlog[slot.tenant] += slot.rows

        def order(i: int) -> tuple[int, int, int, int]:
            tenant = waiting[i][1].tenant
            return rows[tenant], tokens[tenant], backlog[tenant], i

        return min(range(len(waiting)), key=order)

    def _preempt(self) -> None:
        """Abort the youngest batch requests until their rows, the free rows and those already preempted cover the
        rows of the interactive jobs waiting; then, if a tenant holding nothing still waits, the youngest interactive
        request of a tenant holding more than half of the engine (``_rebalance``)."""
        needed = sum(slot.rows for _, slot in self._waiting[INTERACTIVE]) - max(0, self.free) - self._preempting
        if needed <= 0:
            return
        self._preempt_batch(needed)
        self._rebalance()

    def _preempt_batch(self, needed: int) -> None:
        for victim in reversed(list(self._batch)):
            if needed <= 0:
                break
            if victim.preempted:
                continue
            victim.preempted = True
            self._preempting += victim.rows
            self.preemptions += 1
            needed -= victim.rows
            task = asyncio.get_running_loop().create_task(self._abort(victim.request_id))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)

    def _rebalance(self) -> None:
        """Abort the youngest interactive request of the tenant holding the most rows, when that is more than half of
        the engine and a request of a tenant holding none waits without the rows it needs (one at a time: nothing
        is preempted while an earlier preemption's rows are still being let go). Without it a tenant's requests with
        ``n: 8`` on an engine of 8 rows keep another tenant's 8-token job waiting for a whole request of theirs, ten
        times its time alone; the aborted request asks again at the head of the lane and runs from the start."""
        held = self._held[INTERACTIVE]
        if self._preempting or not held:
            return
        starving = [s for _, s in self._waiting[INTERACTIVE] if not s.first and held[s.tenant] == 0]
        if not starving or self.free >= starving[0].rows:
            return
        heavy = max(held, key=lambda tenant: held[tenant])
        if 2 * held[heavy] <= self.capacity:
            return
        victim = next((s for s in reversed(list(self._running)) if s.tenant == heavy and not s.preempted), None)
        if victim is None:
            return
        victim.preempted = True
        self._preempting += victim.rows
        self.preemptions += 1
        task = asyncio.get_running_loop().create_task(self._abort(victim.request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


class HeldMessage(Protocol):
    """What the batch budget reads of a held batch-lane message (``gpu_worker.claims.InFlight``)."""

    @property
    def lines(self) -> int:
        """Engine requests the message stands for: a chunk's lines, or 1 for a job."""

    in_engine: bool  # its requests are waiting for slots or generating


class BatchBudget:
    """How many messages the batch lane's receive loop may ask for: the ``Slots`` interface of the interactive lane
    (``take``, ``give``), counted in lines rather than messages.

    It asks for more only while fewer than ``ahead`` lines wait for an engine slot (lines already waiting in the
    admission, plus those of held messages not yet read), and at most ``max_messages`` messages are held. How many to
    ask for at once: the lines missing, divided by the lines a held message has on average (a chunk's
    ``settings.BATCH_CHUNK_LINES`` until some are held), so a lane of chunks takes one chunk at a time and a lane of
    single jobs ten.
    """

    def __init__(
        self,
        admission: Admission,
        *,
        ahead: int,
        max_messages: int,
        held: Callable[[], Iterable[HeldMessage]],
        stopping: Callable[[], bool] = lambda: False,
        poll_s: float = 0.02,
    ) -> None:
        """``held``: the batch-lane messages the worker holds; ``stopping``: True once the worker stops receiving
        (``take`` then returns 0 at once instead of waiting for lines to drain)."""
        self._admission = admission
        self.ahead = ahead
        self.max_messages = max_messages
        self._held = held
        self._stopping = stopping
        self._poll_s = poll_s
        self.taken = 0  # messages held or being received

    def _waiting_lines(self, held: list[Any]) -> int:
        return self._admission.batch_waiting + sum(m.lines for m in held if not m.in_engine)

    async def take(self, most: int) -> int:
        # Lines enter and leave the admission on every engine step; looking again every poll_s is simpler than
        # wiring a wake-up into each of those moves, and costs nothing next to a step.
        while True:
            if self._stopping():
                return 0
            held = list(self._held())
            waiting = self._waiting_lines(held)
            if waiting < self.ahead and self.taken < self.max_messages:
                break
            await asyncio.sleep(self._poll_s)
        per_message = sum(m.lines for m in held) / len(held) if held else settings.BATCH_CHUNK_LINES
        wanted = max(1, math.ceil((self.ahead - waiting) / max(1.0, per_message)))
        taken = min(most, self.max_messages - self.taken, wanted)
        self.taken += taken
        return taken

    async def give(self, count: int) -> None:
        self.taken -= count

    def saturated(self) -> bool:
        """True while ``take`` would wait: enough lines wait for slots, or the most messages are held."""
        return self._waiting_lines(list(self._held())) >= self.ahead or self.taken >= self.max_messages

    def add(self, count: int) -> None:
        """Count messages held beyond the budget (the fair scout's, ``gpu_worker.fairness``); ``give`` returns them."""
        self.taken += count
