"""Streamed jobs' text, appended to their event log while they decode (``async_inference.streaming.log``).

A job streams when its request asks to (``streams``: ``stream: true``). While it is in the engine, a loop looks at
its text every ``tick_s`` (``Engine.texts_so_far``: no request) and appends what each choice gained as one segment,
at most one every ``interval_s`` per job (``STREAM_INTERVAL_S``; its text is not even read before). So a job costs at
most ``1 / interval_s`` PutItems a second however fast it decodes (a segment stays under one 1 KB write unit up to
some 700 tokens a second), and its first token reaches the log within ``tick_s`` plus one PutItem.

Only text that cannot be taken back is appended: not a trailing partial character (U+FFFD, a multi-byte character
cut between tokens), not what could still be the start of a stop string, and nothing while the request offers tools
(the model's text may turn out to be a tool call, which only the end knows). When the run ends, ``ended`` appends the
last segment: the rest of each choice's text, its finish reason, tool calls and usage, or how it failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from async_inference.schemas import Job
from async_inference.streaming.log import (
    SEQ_PER_ATTEMPT,
    ChoiceEnd,
    Delta,
    End,
    EventLog,
    Segment,
    ToolCallEnd,
)
from gpu_worker.engines.base import Engine, Generation, GenerationAborted, PermanentEngineError

logger = logging.getLogger("gpu_worker.deltas")
IO = Callable[..., Awaitable[Any]]
DEFAULT_INTERVAL_S = 0.25
DEFAULT_TICK_S = 0.05


def streams(request: Any) -> bool:
    """Whether a job's request asks for its answer as it decodes."""
    return getattr(request, "stream", False) is True


def stable(text: str, stops: list[str]) -> str:
    """The part of ``text`` that the finished answer will still start with: cut before the first stop string, before
    the last ``len(longest stop) - 1`` characters (a stop string may be starting there), and before a trailing
    replacement character (a multi-byte character not yet whole)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    if stops:
        cut = min(cut, len(text) - (max(len(s) for s in stops) - 1))
    text = text[: max(cut, 0)]
    return text.rstrip("\ufffd")


@dataclass
class _Stream:
    job_id: str
    tenant: str  # written with each segment: the WebSocket push tells this tenant's connections only
    attempt: int
    stops: list[str]
    live: bool  # text goes out while decoding (False: all of it at the end)
    in_engine: bool = True
    sent: dict[int, str] = field(default_factory=dict)  # choice index -> text appended so far
    seq: int = 0
    written_at: float = float("-inf")
    writing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one write at a time, the end after the last

    def next_seq(self) -> int:
        self.seq += 1
        return self.attempt * SEQ_PER_ATTEMPT + self.seq


@dataclass
class WriteCount:
    """What the writer sent: PutItems (segments) and the characters they carried; tests and the bench read it."""

    segments: int = 0
    characters: int = 0


class DeltaWriter:
    """Appends the text of the streamed jobs in the engine to their log; ``log`` None: nothing streams."""

    def __init__(
        self,
        engine: Engine,
        log: EventLog | None,
        *,
        io: IO,
        interval_s: float = DEFAULT_INTERVAL_S,
        tick_s: float = DEFAULT_TICK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.log = log
        self.interval_s = interval_s
        self.tick_s = tick_s
        self.count = WriteCount()
        self._io = io
        self._clock = clock
        self._streams: dict[str, _Stream] = {}

    def track(self, job: Job, request: Any) -> None:
        """The job is in the engine now; its text is followed if it streams."""
        if self.log is None or not streams(request):
            return
        if job.job_id in self._streams:  # preempted, and admitted again: the same run's log goes on
            self._streams[job.job_id].in_engine = True
            return
        stops = getattr(request, "stop", None) or []
        self._streams[job.job_id] = _Stream(
            job_id=job.job_id,
            tenant=job.tenant,
            attempt=job.attempts,
            stops=[stops] if isinstance(stops, str) else list(stops),
            live=not (getattr(request, "tools", None) or getattr(request, "functions", None)),
        )

    def forget(self, job_id: str) -> None:
        """The job left the engine; its last segment is ``ended``'s to write."""
        stream = self._streams.get(job_id)
        if stream is not None:
            stream.in_engine = False  # a tick must not append once the run's end may be written

    async def run(self) -> None:
        """Append what the streamed jobs gained, every ``tick_s``, until cancelled."""
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.flush()
            except Exception:
                logger.exception("stream flush failed; the next tick tries again")

    async def flush(self, *, force: bool = False) -> int:
        """Append one segment for each live job whose text grew and whose interval has passed (any that grew, with
        ``force``); the segments written."""
        now = self._clock()
        due = []
        for stream in list(self._streams.values()):
            if not (stream.live and stream.in_engine) or stream.writing.locked():
                continue
            if not force and now - stream.written_at < self.interval_s:
                continue
            deltas = self._gained(stream)
            if deltas:
                due.append((stream, deltas))
        await asyncio.gather(*(self._append(stream, deltas, now) for stream, deltas in due))
        return len(due)

    def _gained(self, stream: _Stream) -> list[Delta]:
        texts = self.engine.texts_so_far(stream.job_id)
        if texts is None:
            return []
        deltas = []
        for index, text in enumerate(texts):
            sent = stream.sent.get(index, "")
            now = stable(text, stream.stops)
            if len(now) > len(sent) and now.startswith(sent):
                deltas.append(Delta(index=index, text=now[len(sent) :]))
        return deltas

    async def _append(self, stream: _Stream, deltas: list[Delta], now: float) -> None:
        tokens = self.engine.tokens_so_far(stream.job_id)
        async with stream.writing:
            try:
                segment = Segment(seq=stream.next_seq(), deltas=deltas, completion_tokens=tokens)
                assert self.log is not None
                await self._io(self.log.append, stream.job_id, segment, stream.tenant)
            except Exception as exc:
                stream.seq -= 1
                logger.warning("job %s: stream segment not written (%s); the next tick tries again", stream.job_id, exc)
                return
            self._sent(stream, deltas, now)

    def _sent(self, stream: _Stream, deltas: list[Delta], now: float) -> None:
        for delta in deltas:
            stream.sent[delta.index] = stream.sent.get(delta.index, "") + delta.text
        stream.written_at = now
        self.count.segments += 1
        self.count.characters += sum(len(d.text) for d in deltas)

    async def ended(self, job: Job, outcome: Any) -> None:
        """Append the run's last segment for ``outcome`` (the generation, or the engine error, ``GenerationAborted`` or
        ``TimeoutError`` that ended it); nothing for a job that does not stream, or for an outcome that leaves the job
        to run again (a transient fault: the next run writes its own segments). A failed write is logged: the reader
        then finds the end on the job (``async_inference.streaming.follow``)."""
        stream = self._streams.pop(job.job_id, None)
        if stream is None or self.log is None:
            return
        async with stream.writing:  # after a write in flight, which the end's text must follow
            end = self._end(stream, outcome)
            if end is None:
                return
            try:
                await self._io(self.log.append, job.job_id, Segment(seq=stream.next_seq(), end=end), stream.tenant)
                self.count.segments += 1
            except Exception:
                logger.exception("job %s: its stream's end not written; readers find it on the job", job.job_id)

    @staticmethod
    def _end(stream: _Stream, outcome: Any) -> End | None:
        if isinstance(outcome, Generation):
            choices = []
            for index, choice in enumerate(outcome.choices):
                text, sent = choice.text or "", stream.sent.get(index, "")
                if not text.startswith(sent):  # cannot happen for what ``stable`` lets out; said if it does
                    logger.warning(
                        "job %s: choice %d's answer does not start with its streamed text", stream.job_id, index
                    )
                choices.append(
                    ChoiceEnd(
                        index=index,
                        text=text[len(sent) :] if text.startswith(sent) else "",
                        finish_reason=choice.finish_reason,
                        tool_calls=[
                            ToolCallEnd(id=c.id, name=c.name, arguments=c.arguments) for c in choice.tool_calls
                        ],
                        refusal=choice.refusal,
                    )
                )
            return End(
                status="succeeded",
                choices=choices,
                prompt_tokens=outcome.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                system_fingerprint=outcome.system_fingerprint,
            )
        if isinstance(outcome, GenerationAborted):
            return End(status="cancelled", error="the job was cancelled")
        if isinstance(outcome, PermanentEngineError):
            return End(status="failed", error=str(outcome), code=outcome.code)
        if isinstance(outcome, TimeoutError):
            return End(status="failed", error="execution timed out")
        return None
