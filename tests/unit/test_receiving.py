"""The interactive lane's receive loop (gpu_worker.receiving.Receiver), with the queue faked: what it holds, what it
sends back to the tail of the queue, and in which order."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
from typing import Any

import pytest

from async_inference.aws import QueueMessage
from async_inference.schemas import ClaimCheck
from gpu_worker import receiving
from gpu_worker.batcher import Batcher, Slots
from gpu_worker.claims import InFlight
from gpu_worker.fairness import INTERACTIVE_SCAN_PAUSE_S, TenantShare
from gpu_worker.lanes import INTERACTIVE
from gpu_worker.receiving import Lane, Receiver

DEADLINE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def message(n: int, tenant: str) -> QueueMessage:
    claim = ClaimCheck(
        job_id=f"job_{n:032x}", tenant=tenant, bucket="b", key="k", deadline=DEADLINE, timeout_s=60, rows=8
    )
    return QueueMessage(f"m{n}", f"r{n}", claim.model_dump_json(exclude_none=True), receive_count=1)


class BlockedRequeueQueue:
    """Returns ``messages`` on the first receive; a requeue waits until ``release`` is set."""

    def __init__(self, messages: list[QueueMessage]) -> None:
        self.messages = messages
        self.release = asyncio.Event()
        self.requeued: list[str] = []

    def receive(self, **_: Any) -> list[QueueMessage]:
        messages, self.messages = self.messages, []
        return messages

    async def requeue(self, messages: list[tuple[QueueMessage, str]]) -> list[str]:
        await self.release.wait()
        self.requeued += [m.message_id for m, _ in messages]
        return []


def test_another_tenants_message_starts_before_a_backlog_received_with_it_is_requeued():
    async def scenario() -> tuple[list[str], list[str]]:
        # GIVEN tenant A holding its share (8 rows), and a receive that returns nine more of A's messages with one of
        # B's among them, whose requeue to the tail of the queue takes a while (two SQS requests)
        held = {"m0": InFlight(message=message(0, "tenant-a"), lane=INTERACTIVE)}
        held["m0"].claim = ClaimCheck.model_validate_json(held["m0"].message.body)
        backlog = [message(n, "tenant-a") for n in range(1, 10)]
        queue = BlockedRequeueQueue([*backlog[:7], message(99, "tenant-b"), *backlog[7:]])
        started: list[str] = []
        stopping = False

        async def io(fn: Any, *args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        async def received(count: int, *, held_before: int) -> None:
            return None

        def start(flight: InFlight, lane: Lane, error: Exception | None) -> None:
            nonlocal stopping
            started.append(flight.tenant or "")
            stopping = True  # one receive is enough

        async def flush(handles: list[str]) -> None:
            return None

        receiver = Receiver(
            held=held,
            stopping=lambda: stopping,
            io=io,
            received=received,
            start=start,
            share=TenantShare(8),
            visibility_timeout_s=60,
            receive_wait_s=0,
        )
        lane = Lane(INTERACTIVE, queue, Slots(20), Batcher(flush, max_delay_s=0.1))  # type: ignore[arg-type]
        # WHEN the lane receives
        loop = asyncio.create_task(receiver._receive_loop(lane))
        for _ in range(50):
            await asyncio.sleep(0)
        before_requeue = list(started)
        queue.release.set()
        await asyncio.wait_for(loop, timeout=5)
        return before_requeue, queue.requeued

    before_requeue, requeued = asyncio.run(scenario())
    # THEN B's message was handed to the worker to start while A's nine were still being requeued
    assert before_requeue == ["tenant-b"]
    # AND A's nine went back to the tail of the queue
    assert requeued == [f"m{n}" for n in range(1, 10)]


class BacklogQueue:
    """Returns ten new messages of tenant A on every receive, until ``looks`` receives have been made."""

    def __init__(self, looks: int) -> None:
        self.looks = looks
        self.received = 0

    def receive(self, **_: Any) -> list[QueueMessage]:
        self.received += 1
        first = 10 * self.received
        return [message(n, "tenant-a") for n in range(first, first + 10)]

    def requeue(self, messages: list[tuple[QueueMessage, str]]) -> list[str]:
        return []

    def change_visibility_batch(self, handles: list[str], seconds: int) -> list[str]:
        return []  # the last receive's, handed back at the stop


def test_while_only_a_tenant_at_its_share_turns_up_the_lane_looks_again_within_a_short_pause_that_does_not_grow(
    monkeypatch: pytest.MonkeyPatch,
):
    async def scenario() -> list[float]:
        # GIVEN tenant A holding its share, and a queue in which only more of A's messages turn up, look after look
        held = {"m0": InFlight(message=message(0, "tenant-a"), lane=INTERACTIVE)}
        held["m0"].claim = ClaimCheck.model_validate_json(held["m0"].message.body)
        queue = BacklogQueue(looks=12)
        waits: list[float] = []

        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        monkeypatch.setattr(receiving.asyncio, "sleep", sleep)

        async def io(fn: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        async def received(count: int, *, held_before: int) -> None:
            return None

        async def flush(handles: list[str]) -> None:
            return None

        receiver = Receiver(
            held=held,
            stopping=lambda: queue.received >= queue.looks,
            io=io,
            received=received,
            start=lambda *_: None,
            share=TenantShare(8),
            visibility_timeout_s=60,
            receive_wait_s=0,
        )
        lane = Lane(INTERACTIVE, queue, Slots(20), Batcher(flush, max_delay_s=0.1))  # type: ignore[arg-type]
        # WHEN the lane receives, look after look
        await receiver._receive_loop(lane)
        return waits

    waits = asyncio.run(scenario())
    # THEN it waits the same short pause before each next look, so that another tenant's job arriving meanwhile (0.6 s
    # alone on the local stack's CPU engine) is received within half its own time; it used to double up to 2 s
    assert len(waits) >= 10
    assert set(waits) == {INTERACTIVE_SCAN_PAUSE_S}
    assert INTERACTIVE_SCAN_PAUSE_S <= 0.3
