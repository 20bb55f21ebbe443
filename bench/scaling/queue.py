"""The job queue as SQS shows it: visible and in-flight messages, messages sent, and whether the queue is active."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from bench.scaling.figures import SQS_INACTIVE_AFTER_S


@dataclass
class Job:
    """A job of the trace as it moves through the system; times in simulated seconds, None until they happen."""

    index: int
    submitted_s: float
    context_tokens: int
    generated_tokens: int
    deadline_s: float
    started_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    expired: bool = False
    receives: int = 0


@dataclass
class Queue:
    """Messages visible (FIFO, as SQS approximately delivers them) and the count held by consumers (in flight).

    ``last_access_s`` is the last time a message was in the queue or an API action touched it: SQS publishes metrics
    only while that is under six hours old. Delivery to consumers is done by the simulation (``take``)."""

    visible: deque[Job] = field(default_factory=deque)
    in_flight: int = 0
    sent_total: int = 0
    last_access_s: float = -float("inf")
    became_active_s: float = -float("inf")

    def touch(self, now: float) -> None:
        if not self.active(now):
            self.became_active_s = now
        self.last_access_s = now

    def active(self, now: float) -> bool:
        return now - self.last_access_s < SQS_INACTIVE_AFTER_S

    def send(self, job: Job, now: float) -> None:
        self.touch(now)
        self.visible.append(job)
        self.sent_total += 1

    def take(self, most: int, now: float) -> list[Job]:
        """Receive up to ``most`` messages: they leave the visible set and count as in flight."""
        self.touch(now)
        taken = [self.visible.popleft() for _ in range(min(most, len(self.visible)))]
        self.in_flight += len(taken)
        for job in taken:
            job.receives += 1
        return taken

    def delete(self, count: int = 1) -> None:
        self.in_flight -= count

    def release(self, jobs: list[Job], now: float) -> None:
        """Held messages made visible again (a drain's leftovers), ahead of newer ones as their age puts them."""
        self.touch(now)
        self.in_flight -= len(jobs)
        for job in sorted(jobs, key=lambda j: j.submitted_s, reverse=True):
            self.visible.appendleft(job)

    @property
    def outstanding(self) -> int:
        return len(self.visible) + self.in_flight
