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
engine step (a free reserved slot, or one freed by an abort). Only interactive jobs themselves can fill the engine
against another interactive job, as without batches. With the batch lane alone, the engine runs
``capacity - reserve`` lines at once.

Within a lane, a freed slot goes to the waiting request whose tenant holds the fewest slots of that lane, the oldest
among those (a preempted request asking again keeps its place at the head): a tenant whose many requests wait here
cannot keep another tenant's request waiting for longer than the next slot that frees (docs/security.md, "Fair
scheduling").

``BatchBudget`` decides how many batch-lane messages to ask SQS for: enough that about one engine's worth of lines
waits for slots, so the engine never runs dry between chunks, and no more, so that a batch's chunks spread over the
fleet instead of collecting in one worker.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
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
    """An engine slot held by one request. ``preempted`` is set when the admission aborted the request to give its
    slot to an interactive job: the holder lets the slot go and asks again."""

    lane: str
    request_id: str
    preempted: bool = False
    tenant: str = ""
    first: bool = False  # asks again after a preemption: waits at the head of its lane


class Admission:
    """The engine's slots, shared by the two lanes (the policy in this module's docstring).

    ``async with admission:`` takes an interactive slot, as the semaphore it replaces did; ``admission.slot(lane,
    request_id)`` takes a slot in either lane and yields the ``Slot``. ``abort`` is the engine's abort, called with
    the request id of a preempted batch line.
    """

    def __init__(self, capacity: int, *, reserve: int, abort: Callable[[str], Awaitable[None]]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not 0 <= reserve < capacity:
            raise ValueError(f"the interactive reserve must be 0 to {capacity - 1} (capacity - 1), got {reserve}")
        self.capacity = capacity
        self.reserve = reserve
        self._abort = abort
        self._interactive = 0  # interactive slots held
        self._batch: dict[Slot, None] = {}  # batch slots held, oldest first
        self._waiting: dict[str, collections.deque[tuple[asyncio.Future[None], Slot]]] = {
            lane: collections.deque() for lane in LANES
        }
        self._preempting = 0  # preempted batch slots not yet let go
        self._held: dict[str, collections.Counter[str]] = {lane: collections.Counter() for lane in LANES}  # by tenant
        self._aborts: set[asyncio.Task[None]] = set()
        self.preemptions = 0  # batch requests aborted for an interactive job, since start

    # --- what the lanes see ---------------------------------------------------------------------------------------

    @property
    def free(self) -> int:
        return self.capacity - self._interactive - len(self._batch)

    @property
    def in_engine(self) -> dict[str, int]:
        return {INTERACTIVE: self._interactive, BATCH: len(self._batch)}

    @property
    def batch_waiting(self) -> int:
        """Batch requests waiting for a slot."""
        return len(self._waiting[BATCH])

    @property
    def interactive_waiting(self) -> int:
        return len(self._waiting[INTERACTIVE])

    # --- taking and giving slots ----------------------------------------------------------------------------------

    async def __aenter__(self) -> None:
        await self._acquire(Slot(INTERACTIVE, ""))

    async def __aexit__(self, *exc: object) -> None:
        self._release(Slot(INTERACTIVE, ""))

    @asynccontextmanager
    async def slot(self, lane: str, request_id: str, *, first: bool = False, tenant: str = "") -> AsyncIterator[Slot]:
        """Hold an engine slot of ``lane`` for ``request_id`` of ``tenant``. ``first``: wait at the head of the lane
        (a preempted request asking again keeps its place)."""
        if lane not in LANES:
            raise ValueError(f"lane {lane!r} is not one of {LANES}")
        held = Slot(lane, request_id, tenant=tenant, first=first)
        await self._acquire(held, first=first)
        try:
            yield held
        finally:
            self._release(held)

    def _may_start(self, lane: str) -> bool:
        if lane == INTERACTIVE:
            return self.free > 0
        return self.free > self.reserve and not self._waiting[INTERACTIVE]

    async def _acquire(self, slot: Slot, *, first: bool = False) -> None:
        waiting = self._waiting[slot.lane]
        if not waiting and self._may_start(slot.lane):
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
        self._held[slot.lane][slot.tenant] += 1
        if slot.lane == INTERACTIVE:
            self._interactive += 1
        else:
            self._batch[slot] = None

    def _release(self, slot: Slot) -> None:
        held = self._held[slot.lane]
        held[slot.tenant] -= 1
        if held[slot.tenant] <= 0:
            del held[slot.tenant]
        if slot.lane == INTERACTIVE:
            self._interactive -= 1
        else:
            self._batch.pop(slot, None)
            if slot.preempted:
                self._preempting -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiters, interactive ones first; preempt for interactive waiters left without one."""
        for lane in LANES:
            waiting = self._waiting[lane]
            while waiting and self._may_start(lane):
                future, slot = self._next(lane)
                if future.done():  # its waiter was cancelled
                    continue
                self._grant(slot)
                future.set_result(None)
        self._preempt()

    def _next(self, lane: str) -> tuple[asyncio.Future[None], Slot]:
        """Take the waiter a freed slot of ``lane`` goes to: a preempted request asking again (at the head), else the
        oldest of the tenant that holds the fewest of the lane's slots (one pass over those waiting: at most the
        worker's held messages, or a chunk's lines)."""
        waiting = self._waiting[lane]
        head = waiting[0]
        if head[1].first or len(waiting) == 1:
            return waiting.popleft()
        held = self._held[lane]
        best = min(range(len(waiting)), key=lambda i: (held[waiting[i][1].tenant], i))
        entry = waiting[best]
        del waiting[best]
        return entry

    def _preempt(self) -> None:
        """Abort as many of the youngest batch requests as interactive jobs wait beyond those already preempted."""
        needed = len(self._waiting[INTERACTIVE]) - max(0, self.free) - self._preempting
        if needed <= 0:
            return
        for victim in reversed(list(self._batch)):
            if needed == 0:
                break
            if victim.preempted:
                continue
            victim.preempted = True
            self._preempting += 1
            self.preemptions += 1
            needed -= 1
            task = asyncio.get_running_loop().create_task(self._abort(victim.request_id))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)


class HeldMessage(Protocol):
    """What the batch budget reads of a held batch-lane message (``gpu_worker.claims.InFlight``)."""

    lines: int  # engine requests the message stands for: a chunk's lines, or 1 for a job
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
