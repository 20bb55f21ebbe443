"""Fair holding between tenants: which received messages of the interactive lane a worker keeps, and which it sends
back to the tail of the queue because their tenant already holds its share here (docs/security.md, "Fair
scheduling").

One tenant may hold at most ``share`` engine rows of a worker's received messages: the engine's capacity plus the
prefetch, what a worker held before there was a share, so a tenant alone runs as fast as it did. A message counts the
rows its claim check says its request takes (its ``n``; one for a claim check that does not say): counted as messages,
40 requests of ``n: 8`` were a share of 320 rows on an engine of 8, all held by one worker ahead of other tenants'.
A tenant is kept a message while it holds fewer rows than its share, so a request wider than what is left of the share
is still held (and the engine kept busy), never starved. The worker has ``WorkerConfig.fair_room``
places more (half the prefetch, at least one), which only other tenants' messages fill. A message received for a
tenant at its share is requeued (``JobQueue.requeue``: sent again at the tail, the received copy deleted) instead of
held, so a backlog of one tenant in front of another's message is stepped over, a few messages per receive, instead
of run first. Once the other tenant's message is held, the engine's admission (``gpu_worker.lanes.Admission``) gives
it the next slot that frees, ahead of the waiting messages of the tenant holding more slots.

The batch lane's budget counts lines waiting rather than messages, so it has a scout instead of a room: while the
budget takes no more, the worker receives one message each scan pause and holds it only if its tenant holds
none of the lane's messages here (a share of one), requeueing it otherwise. A batch queued behind another tenant's
chunks is thus held within a few scouts, and its lines take the next slots that free (the admission's order).

Requeued messages stay visible in the queue (the scaling metric counts them). A message received more than once (a
retry, a redelivery after a crash) is kept whatever its tenant holds: requeueing it would start its receive count
over and take it past the dead-letter queue's limit.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Protocol, TypeVar

# After a receive in which every message belonged to tenants at their share (nothing else is visible, or not yet),
# the interactive lane waits INTERACTIVE_SCAN_PAUSE_S before it looks again, however often that happens: another
# tenant's job arriving meanwhile is received at the next look, on a fair queue ahead of the backlog (AWS's fair queues
# by message group, which the local runtime's moto emulates: local_runtime/moto_main.py), so it waits at most that
# long. A worker with one tenant's backlog then costs a receive, a batched send and a batched delete per pause, about
# nine requests a second. Before, the pause doubled from 0.5 s to 2 s, and each pause came after up to five more full
# receives in a row (to step over a backlog on moto's queues, which were not fair): as many requests a second, and
# another tenant's 8-token job, 0.6 s alone, took 1.9 s behind 40 of A's n-8 jobs, most of it waiting for the pause
# (bench/attacks_stack.py). The batch lane's scout pauses FAIR_SCAN_PAUSE_S, doubling up to FAIR_SCAN_PAUSE_MAX_S
# while each look finds only tenants holding messages there: with a fixed 0.5 s pause it made a 5,000-line
# single-tenant embeddings batch cost 0.62 AWS requests per line, where a 500-line one cost 0.19 before the scout
# existed (bench/embed_bench.py).
INTERACTIVE_SCAN_PAUSE_S = 0.3
FAIR_SCAN_PAUSE_S = 0.5
FAIR_SCAN_PAUSE_MAX_S = 2.0


class ScanPause:
    """How long a lane waits before it looks over the queue again (see INTERACTIVE_SCAN_PAUSE_S)."""

    def __init__(self, first_s: float = FAIR_SCAN_PAUSE_S, max_s: float = FAIR_SCAN_PAUSE_MAX_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.next_s = first_s

    def found(self) -> None:
        """A look found a message to hold: the next pause is the shortest again."""
        self.next_s = self.first_s

    def nothing(self) -> float:
        """A look found only tenants at their share: the pause to wait now; the next one is twice as long, up to
        ``max_s``."""
        pause, self.next_s = self.next_s, min(2 * self.next_s, self.max_s)
        return pause


class Held(Protocol):
    """What the share reads of a received or held message (``gpu_worker.claims.InFlight``)."""

    @property
    def tenant(self) -> str | None: ...

    @property
    def receive_count(self) -> int: ...

    @property
    def rows(self) -> int: ...


def rows_held(held: Iterable[Held]) -> collections.Counter[str]:
    """The engine rows each tenant's ``held`` messages take."""
    counts: collections.Counter[str] = collections.Counter()
    for message in held:
        if message.tenant is not None:
            counts[message.tenant] += message.rows
    return counts


H = TypeVar("H", bound=Held)


class TenantShare:
    """Splits received messages into those to hold and those to requeue, given what each tenant holds already."""

    def __init__(self, share: int) -> None:
        if share < 1:
            raise ValueError(f"a tenant's share must be at least 1 row, got {share}")
        self.share = share
        self.requeued = 0  # messages requeued since start

    def split(self, received: Iterable[H], holding: collections.Counter[str]) -> tuple[list[H], list[H]]:
        """(keep, requeue): a message is kept when its tenant holds fewer than ``share`` rows (``holding``, plus the
        rows of those kept before it), when it has no tenant (not a claim: the runner deletes or retries it), or when it was received before."""
        counts = collections.Counter(holding)
        keep: list[H] = []
        requeue: list[H] = []
        for message in received:
            tenant = message.tenant
            if tenant is None or message.receive_count > 1 or counts[tenant] < self.share:
                keep.append(message)
                if tenant is not None:
                    counts[tenant] += message.rows
            else:
                requeue.append(message)
        self.requeued += len(requeue)
        return keep, requeue
