"""Following a job's event log: its segments in order as the worker writes them, until the run's end.

The log is polled (one strongly consistent Query every ``poll_s`` while nothing new came); every ``check_s`` without
a segment the job itself is looked at, because not every end is written to the log: a job cancelled through the API,
failed by the dead-letter handler, or whose log expired ends only on the job. ``ended`` turns that look into an
``End`` (None while the job still runs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from async_inference.streaming.log import End, EventLog, Segment

DEFAULT_POLL_S = 0.1
DEFAULT_CHECK_S = 2.0


class StreamInterrupted(Exception):
    """The stream cannot go on; the message says why and where the answer is."""


@dataclass(frozen=True)
class Follow:
    """How a reader follows a log: ``poll_s`` between Queries that found nothing, ``check_s`` between looks at the
    job, ``max_wait_s`` before it gives up (the job goes on), and the clock and sleep (tests replace them)."""

    poll_s: float = DEFAULT_POLL_S
    check_s: float = DEFAULT_CHECK_S
    max_wait_s: float = 15 * 60  # API Gateway's REST response streaming holds a connection at most 15 minutes
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def follow(
    log: EventLog,
    job_id: str,
    ended: Callable[[], End | None],
    *,
    after: int = -1,
    how: Follow = Follow(),  # noqa: B008 (frozen)
) -> Iterator[Segment]:
    """The job's segments after ``seq`` ``after``, as they are written, ending with one that has ``end`` (a segment
    made from ``ended`` when the end is only on the job). Raises ``StreamInterrupted`` when the job's run restarted
    after the stream showed some of it (a worker died: the text cannot be taken back), or after ``max_wait_s``."""
    started = how.clock()
    last_check = started
    attempt: int | None = None
    while True:
        segments = log.after(job_id, after)
        for segment in segments:
            if attempt is not None and segment.attempt != attempt:
                raise StreamInterrupted(
                    f"job {job_id} restarted on another worker after part of its answer was streamed; "
                    f"its answer will be at GET /v1/jobs/{job_id}"
                )
            attempt = segment.attempt
            after = segment.seq
            yield segment
            if segment.end is not None:
                return
        if segments:
            continue  # a full page: read on at once
        now = how.clock()
        if now - last_check >= how.check_s:
            last_check = now
            end = ended()
            if end is not None:
                # The worker writes its end segment before the job's final state: one more read finds it if it is there.
                tail = log.after(job_id, after)
                if tail:
                    continue
                yield Segment(seq=after + 1, end=end)
                return
        if now - started >= how.max_wait_s:
            raise StreamInterrupted(
                f"job {job_id} is still running after {how.max_wait_s:g} s, the longest a stream is held; "
                f"it goes on: GET /v1/jobs/{job_id}"
            )
        how.sleep(how.poll_s)
