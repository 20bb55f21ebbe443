"""Receivers that held a delivery to its deadline, left alone for a while.

The dispatcher delivers a batch of events at once and its invocation ends when the slowest delivery does; the next
batch waits for it, whoever's events are in it. Bounding each attempt (``delivery``) caps what one slow receiver costs
a batch; a receiver that used its whole deadline is not attempted again, by this dispatcher process, for
``SLOW_RECEIVER_PAUSE_S``: its events during that time are failed attempts at once (recorded, retried after the usual
backoff, the dead-letter queue after the last), so that a tenant with many events for a slow receiver costs the other
tenants' batches one deadline per pause, not one per event. A receiver is its URL's host and port. The dispatcher keeps
the same account by tenant (any of its receivers held an attempt to the deadline: the tenant's other receivers are
left alone too), or a tenant naming a new host or port for each event would cost one deadline per batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SLOW_RECEIVER_PAUSE_S = 60.0


class SlowReceivers:
    """The receivers whose last attempt reached the deadline, and until when they are left alone. Thread-safe."""

    def __init__(self, pause_s: float = SLOW_RECEIVER_PAUSE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.pause_s = pause_s
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def slow(self, receiver: str) -> None:
        """``receiver`` held an attempt to its deadline."""
        with self._lock:
            self._until[receiver] = self._clock() + self.pause_s

    def paused(self, receiver: str) -> float:
        """Seconds ``receiver`` is still left alone (0: attempt it)."""
        with self._lock:
            until = self._until.get(receiver)
            if until is None:
                return 0.0
            left = until - self._clock()
            if left <= 0:
                del self._until[receiver]
                return 0.0
            return left
