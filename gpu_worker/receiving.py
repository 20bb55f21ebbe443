"""The pump's receiving side: the lanes a worker receives from, and the loops that fill them.

Each lane (``Lane``) is a queue, the budget of messages the worker may hold from it (``Slots`` for the job queue,
``gpu_worker.lanes.BatchBudget`` for the batch-lane queue) and its batched deletes. The ``Receiver`` receives from each
lane as long as its budget lets, parses each body once into its claim (``gpu_worker.claims``), keeps a message the
worker holds already from starting twice, splits what was received by tenant (``gpu_worker.fairness``: a tenant at its
share has its messages requeued), and hands each message to hold to the worker's ``start``
(``gpu_worker.worker.Worker``). It reads the worker's held messages and its stop flag, and never settles a message:
deleting, retrying and handing back are the worker's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from async_inference import settings
from async_inference.aws import JobQueue, QueueMessage
from gpu_worker.batcher import Batcher, Slots
from gpu_worker.claims import InFlight, parse_claim
from gpu_worker.config import WorkerConfig
from gpu_worker.fairness import INTERACTIVE_SCAN_PAUSE_S, ScanPause, TenantShare, rows_held
from gpu_worker.lanes import BATCH, INTERACTIVE, Admission, BatchBudget

__all__ = ["DELETE_BATCH_DELAY_S", "Lane", "Receiver", "open_lanes"]
logger = logging.getLogger("gpu_worker")
IO = Callable[..., Awaitable[Any]]
# How long a finished claim's delete may wait for nine others. Its message is no longer extended by the heartbeat but
# still has most of a visibility timeout left, so a short wait costs nothing and saves most DeleteMessageBatch calls.
DELETE_BATCH_DELAY_S = 0.5


@dataclass
class Lane:
    """A queue the worker receives from, the budget of messages it may hold from it, and its batched deletes."""

    name: str  # lanes.INTERACTIVE or lanes.BATCH
    queue: JobQueue
    held: Slots | BatchBudget
    deletes: Batcher


def _lane(name: str, queue: JobQueue, held: Slots | BatchBudget, io: IO) -> Lane:
    async def delete(handles: list[str]) -> None:
        failed = await io(queue.delete_batch, handles)
        if failed:
            logger.warning("%d deletes failed; those messages will be redelivered and found finished", len(failed))

    return Lane(name, queue, held, Batcher(delete, max_delay_s=DELETE_BATCH_DELAY_S))


def open_lanes(
    config: WorkerConfig,
    capacity: int,
    *,
    jobs: JobQueue,
    admission: Admission,
    held: Mapping[str, InFlight],
    stopping: Callable[[], bool],
    io: IO,
) -> dict[str, Lane]:
    """The lanes of a worker whose engine has ``capacity`` slots: the job queue (``jobs``), which holds up to
    ``held_messages`` and the fair room beyond it, and the batch-lane queue when ``config`` has one, whose budget counts
    the lines of the batch-lane messages among ``held`` (the worker's held messages, by message id)."""
    lanes = {
        INTERACTIVE: _lane(INTERACTIVE, jobs, Slots(config.held_messages(capacity) + config.fair_room(capacity)), io)
    }
    if config.batch_queue_url is not None:
        budget = BatchBudget(
            admission,
            ahead=capacity,
            max_messages=config.held_messages(capacity),
            held=lambda: [f for f in held.values() if f.lane == BATCH],
            stopping=stopping,
        )
        lanes[BATCH] = _lane(BATCH, JobQueue(config.batch_queue_url), budget, io)
    return lanes


class Received(Protocol):
    """Told of the messages about to be held (``gpu_worker.task_protection.Policy.received``)."""

    async def __call__(self, count: int, *, held_before: int) -> None: ...


class Receiver:
    """Receives from the lanes, and hands each message to hold, parsed, to ``start``."""

    def __init__(
        self,
        *,
        held: Mapping[str, InFlight],
        stopping: Callable[[], bool],
        io: IO,
        received: Received,
        start: Callable[[InFlight, Lane, Exception | None], None],
        share: TenantShare,
        visibility_timeout_s: int,
        receive_wait_s: int,
    ) -> None:
        """``held``: the messages the worker holds, by message id (``start`` adds to them, the worker removes them once
        settled); ``stopping``: True once the worker stops receiving; ``io``: runs a blocking call in the worker's pool;
        ``received``: told before messages are handed to ``start``; ``share``: the most messages of the interactive
        lane one tenant holds; ``visibility_timeout_s`` and ``receive_wait_s``: each receive's."""
        self._held = held
        self._stopping = stopping
        self._io = io
        self._received = received
        self._start = start
        self.share = share
        # The interactive lane's looks past tenants at their share: a short pause that does not grow.
        self._scan_pause = ScanPause(INTERACTIVE_SCAN_PAUSE_S, INTERACTIVE_SCAN_PAUSE_S)
        self._visibility_timeout_s = visibility_timeout_s
        self._receive_wait_s = receive_wait_s

    async def run(self, lanes: Mapping[str, Lane], receivers: int) -> None:
        """Receive until the stop: ``receivers`` loops on the interactive lane, and the batch lane's loop and scout."""
        loops = [self._receive_loop(lanes[INTERACTIVE]) for _ in range(receivers)]
        if BATCH in lanes:
            loops.append(self._receive_loop(lanes[BATCH]))
            loops.append(self._scout_loop(lanes[BATCH]))
        await asyncio.gather(*loops)

    async def _receive_loop(self, lane: Lane) -> None:
        """Receive from one lane's queue as long as its budget lets."""
        while not self._stopping():
            taken = await lane.held.take(settings.RECEIVE_BATCH_SIZE)
            if self._stopping():
                await lane.held.give(taken)
                return
            try:
                messages = await self._io(
                    lane.queue.receive,
                    max_messages=taken,
                    wait_s=self._receive_wait_s,
                    visibility_timeout_s=self._visibility_timeout_s,
                )
            except Exception:
                logger.exception("receive failed; retrying in 1 s")
                await lane.held.give(taken)
                await asyncio.sleep(1)
                continue
            await lane.held.give(taken - len(messages))
            if self._stopping() and messages:
                # Received after the stop began: hand them straight back.
                await self._io(lane.queue.change_visibility_batch, [m.receipt_handle for m in messages], 0)
                await lane.held.give(len(messages))
                return
            received = [self._parse(message, lane) for message in await self._fresh(messages, lane)]
            if lane.name != INTERACTIVE:
                await self._hold(lane, received)
                continue
            # The kept messages start before the others are requeued: another tenant's job received among a
            # backlog's waits for no send and delete of that backlog's messages.
            received, requeue = self._split(lane, received, self.share)
            await self._hold(lane, received)
            await self._requeue(lane, requeue, pause=self._scan_pause, kept=bool(received))

    async def _hold(self, lane: Lane, received: list[tuple[InFlight, Exception | None]]) -> None:
        """Hand each received message to the worker's ``start``."""
        await self._received(len(received), held_before=len(self._held))
        for flight, parse_error in received:
            self._start(flight, lane, parse_error)

    async def _fresh(self, messages: list[QueueMessage], lane: Lane) -> list[QueueMessage]:
        """The messages this worker does not hold already. One it holds, received again (its visibility lapsed before
        a heartbeat extended it), must not start its claim a second time: SQS honours only the newest receipt handle
        for a delete or a visibility change, so the running flight takes it, and its place in the budget is given
        back."""
        fresh: list[QueueMessage] = []
        for message in messages:
            held = self._held.get(message.message_id)
            if held is None:
                fresh.append(message)
                continue
            logger.info("%s: received again while held here; keeping the newest receipt handle", held.ident)
            held.message = message
            await lane.held.give(1)
        return fresh

    async def _scout_loop(self, lane: Lane) -> None:
        """The batch lane's look past one tenant's chunks (``gpu_worker.fairness``): while the lane's budget takes no
        more, one message each ``ScanPause`` (0.5 s, growing to 2 s while it finds only tenants holding messages
        here), held if its tenant holds none of the lane's messages here, requeued if it does."""
        budget = lane.held
        assert isinstance(budget, BatchBudget)
        pause = ScanPause()
        while not self._stopping():
            await asyncio.sleep(pause.next_s)
            holding = rows_held(f for f in self._held.values() if f.lane == lane.name)
            if not holding or not budget.saturated() or self._stopping():
                continue  # nothing to look past, or the budget's own receive is taking messages
            try:
                messages = await self._io(
                    lane.queue.receive, max_messages=1, wait_s=1, visibility_timeout_s=self._visibility_timeout_s
                )
            except Exception:
                logger.exception("scout receive failed; looking again later")
                continue
            if self._stopping() and messages:
                await self._io(lane.queue.change_visibility_batch, [m.receipt_handle for m in messages], 0)
                return
            budget.add(len(messages))  # held from here: every held message is given back once settled
            fresh = [self._parse(m, lane) for m in await self._fresh(messages, lane)]
            received, requeue = self._split(lane, fresh, TenantShare(1))
            if received:
                pause.found()
            elif messages:
                pause.nothing()
            await self._hold(lane, received)
            await self._requeue(lane, requeue, pause=None)

    @staticmethod
    def _parse(message: QueueMessage, lane: Lane) -> tuple[InFlight, Exception | None]:
        """The message, parsed once into its claim (None, and why, for a body that is none)."""
        flight = InFlight(message=message, lane=lane.name)
        try:
            flight.claim = parse_claim(message.body)
        except ValueError as exc:
            return flight, exc
        return flight, None

    def _split(
        self, lane: Lane, received: list[tuple[InFlight, Exception | None]], share: TenantShare
    ) -> tuple[list[tuple[InFlight, Exception | None]], list[InFlight]]:
        """(to hold, to requeue): the received messages, those of tenants at their ``share`` to requeue
        (``gpu_worker.fairness``)."""
        holding = rows_held(f for f in self._held.values() if f.lane == lane.name)
        keep, requeue = share.split([flight for flight, _ in received], holding)
        kept = {id(f) for f in keep}
        return [(flight, error) for flight, error in received if id(flight) in kept], requeue

    async def _requeue(
        self, lane: Lane, requeue: list[InFlight], *, pause: ScanPause | None, kept: bool = False
    ) -> None:
        """Send ``requeue`` back to the tail of the queue and give their places back; ``pause``: wait before the next
        look when none was ``kept``."""
        if requeue:
            logger.debug("requeueing %d messages of tenants at their share", len(requeue))
            try:
                failed = await self._io(lane.queue.requeue, [(f.message, f.tenant or "") for f in requeue])
                if failed:
                    logger.warning("%d messages not requeued; they return after their visibility timeout", len(failed))
            except Exception:
                logger.exception(
                    "requeue failed; those %d messages return after their visibility timeout", len(requeue)
                )
            await lane.held.give(len(requeue))
        if pause is None:
            return
        if kept:
            pause.found()
        elif requeue:
            # Only tenants at their share are visible: look again soon, not at once (gpu_worker.fairness).
            await asyncio.sleep(pause.nothing())
