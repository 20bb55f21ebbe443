"""Two small helpers of the worker's loops: ``Slots``, the budget of messages a lane may hold, and ``Batcher``, which
turns one request per item (an SQS delete, an SNS publish) into one batch request per ten."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Slots:
    """Free places in the engine's batch: a receiver takes up to 10 before it asks SQS for that many messages."""

    def __init__(self, capacity: int) -> None:
        self.free = capacity
        self._changed = asyncio.Condition()

    async def take(self, most: int) -> int:
        async with self._changed:
            await self._changed.wait_for(lambda: self.free > 0)
            taken = min(most, self.free)
            self.free -= taken
            return taken

    async def give(self, count: int) -> None:
        async with self._changed:
            self.free += count
            self._changed.notify_all()


class Batcher:
    """Gathers items and hands them to ``flush`` in groups of up to ``max_size``, at most ``max_delay_s`` late.
    Turns one SQS DeleteMessage (or SNS Publish) per job into one batch request per ten.

    ``flush`` returns one result per item (or None when there is nothing to report); ``add`` returns a future of the
    item's result, which callers that must know (was my notification published?) await.
    """

    def __init__(
        self,
        flush: Callable[[list[Any]], Awaitable[list[Any] | None]],
        *,
        max_size: int = 10,
        max_delay_s: float = 0.05,
    ):
        self._flush = flush
        self._max_size = max_size
        self._max_delay_s = max_delay_s
        self._items: list[tuple[Any, asyncio.Future[Any]]] = []
        self._timer: asyncio.Task[None] | None = None

    async def add(self, item: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._items.append((item, future))
        if len(self._items) >= self._max_size:
            await self._drain()
        elif self._timer is None:
            self._timer = asyncio.create_task(self._later())
        return future

    async def _later(self) -> None:
        await asyncio.sleep(self._max_delay_s)
        self._timer = None
        await self._drain()

    async def _drain(self) -> None:
        while self._items:
            chunk, self._items = self._items[: self._max_size], self._items[self._max_size :]
            try:
                results = await self._flush([item for item, _ in chunk])
            except Exception as exc:  # every item of the chunk shares the failure
                for _, future in chunk:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for index, (_, future) in enumerate(chunk):
                if not future.done():
                    future.set_result(results[index] if results is not None else None)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._drain()
