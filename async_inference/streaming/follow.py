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
from typing import Any

from async_inference.jobs import FINAL_STATES, JobStatus
from async_inference.schemas import Job
from async_inference.streaming.log import ChoiceEnd, End, EventLog, Segment, ToolCallEnd

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
    # An empty segment after this long without one, for the stream to send a comment: API Gateway closes a stream idle
    # for 5 minutes (regional endpoint; 30 s edge-optimized), and a job may wait in the queue longer than that.
    keepalive_s: float = 15.0
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
    made from ``ended`` when the end is only on the job); an empty segment (no deltas, no end) after each
    ``keepalive_s`` without one. Raises ``StreamInterrupted`` when the job's run restarted
    after the stream showed some of it (a worker died: the text cannot be taken back), or after ``max_wait_s``."""
    started = how.clock()
    last_check = last_yield = started
    attempt: int | None = None
    shown: dict[int, str] = {}  # choice index -> text the segments so far carried
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
            for delta in segment.deltas:
                shown[delta.index] = shown.get(delta.index, "") + delta.text
            last_yield = how.clock()
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
                yield Segment(seq=after + 1, end=_after_shown(end, shown))
                return
        if now - last_yield >= how.keepalive_s:
            last_yield = now
            yield Segment(seq=after)
        if now - started >= how.max_wait_s:
            raise StreamInterrupted(
                f"job {job_id} is still running after {how.max_wait_s:g} s, the longest a stream is held; "
                f"it goes on: GET /v1/jobs/{job_id}"
            )
        how.sleep(how.poll_s)


def _after_shown(end: End, shown: dict[int, str]) -> End:
    """``end`` without the text the stream showed already (an end read from the job carries the whole answer)."""
    choices = [
        choice.model_copy(update={"text": choice.text.removeprefix(shown.get(choice.index, ""))})
        for choice in end.choices
    ]
    return end.model_copy(update={"choices": choices})


def end_of(job: Job, result: dict[str, Any] | None = None) -> End | None:
    """The end of a job as the job itself tells it (None while it has not ended): a succeeded job's from its stored
    ``result`` (a chat.completion, a text_completion or a Response, as the job's endpoint stores it: its choices or
    output items, tool calls and usage), another's from its state and reason. A reader's ``ended`` for ``follow``."""
    if job.status not in FINAL_STATES:
        return None
    if job.status is not JobStatus.SUCCEEDED:
        return End(status=job.status.value, error=job.error, code=job.error_code)
    if result is None:
        return End(status="failed", error=f"the job succeeded but its result is gone: GET /v1/jobs/{job.job_id}")
    if result.get("object") == "response":
        return _response_end(result)
    choices = []
    for choice in result.get("choices", []):
        message = choice.get("message") or {}
        calls = [
            ToolCallEnd(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]
        choices.append(
            ChoiceEnd(
                index=choice.get("index", 0),
                text=message.get("content") or choice.get("text") or "",  # text: a text_completion's choice
                finish_reason=choice.get("finish_reason") or "stop",
                tool_calls=calls,
                refusal=message.get("refusal"),
            )
        )
    usage = result.get("usage") or {}
    return End(
        status="succeeded",
        choices=choices,
        prompt_tokens=usage.get("prompt_tokens", 0),
        completion_tokens=usage.get("completion_tokens", 0),
        system_fingerprint=result.get("system_fingerprint"),
    )


def _response_end(response: dict[str, Any]) -> End:
    """The end of a Responses job from its stored Response: its message's text and refusal, its function calls."""
    text, refusal, calls = "", None, []
    for item in response.get("output", []):
        if item.get("type") == "message":
            for part in item.get("content", []):
                if part.get("type") == "output_text":
                    text += part.get("text", "")
                elif part.get("type") == "refusal":
                    refusal = part.get("refusal")
        elif item.get("type") == "function_call":
            calls.append(ToolCallEnd(id=item["call_id"], name=item["name"], arguments=item["arguments"]))
    finish = "length" if response.get("status") == "incomplete" else "tool_calls" if calls else "stop"
    usage = response.get("usage") or {}
    return End(
        status="succeeded",
        choices=[ChoiceEnd(text=text, finish_reason=finish, tool_calls=calls, refusal=refusal)],
        prompt_tokens=usage.get("input_tokens", 0),
        completion_tokens=usage.get("output_tokens", 0),
    )
