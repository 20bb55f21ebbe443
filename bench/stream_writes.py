"""How many log writes (PutItems) a streamed job costs per thousand tokens at a given decode speed: the delta writer
with its defaults over the echo engine at a set pace, its writes counted (no AWS: the count is the writer's).

    PYTHONPATH=. .venv/bin/python -m bench.stream_writes
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from async_inference.jobs import JobStatus
from async_inference.schemas import ChatCompletionRequest, Job
from async_inference.streaming.log import Segment
from gpu_worker.deltas import DeltaWriter
from gpu_worker.engines.echo import EchoEngine

RATES = (10, 20, 50, 100)  # tokens a second of one sequence
SECONDS = 5


class CountingLog:
    """Stands in for ``EventLog``: counts the appends."""

    def __init__(self) -> None:
        self.writes = 0

    def append(self, job_id: str, segment: Segment) -> None:
        self.writes += 1


async def _io(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def running_job(job_id: str) -> Job:
    """A job as the worker holds it once it runs (its first attempt)."""
    now = dt.datetime.now(dt.UTC)
    return Job(
        job_id=job_id,
        tenant="bench",
        status=JobStatus.RUNNING,
        created_at=now,
        updated_at=now,
        attempts=1,
        request_bucket="b",
        request_key="k",
        deadline=now,
        timeout_s=600,
    )


def streamed_request(prompt: str, max_tokens: int) -> ChatCompletionRequest:
    """A chat request that asks to stream (set past the schema, which refuses it until the routes take it)."""
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0.0
    )
    return request.model_copy(update={"stream": True})


async def writes_for(rate: int, tokens: int) -> int:
    """The PutItems of one streamed job of ``tokens`` tokens decoded at ``rate`` a second."""
    job = running_job("job_bench")
    request = streamed_request(" ".join(f"w{i}" for i in range(tokens)), tokens)
    engine, log = EchoEngine(delay_s=tokens / rate), CountingLog()
    writer = DeltaWriter(engine, log, io=_io)  # type: ignore[arg-type]  # counts in place of the table
    writer.track(job, request)
    pump = asyncio.create_task(writer.run())
    generation = await engine.generate(job.job_id, request)
    writer.forget(job.job_id)
    await writer.ended(job, generation)
    pump.cancel()
    return log.writes


def main() -> None:
    for rate in RATES:
        tokens = rate * SECONDS
        writes = asyncio.run(writes_for(rate, tokens))
        print(
            f"{rate:>4} tokens/s: {writes} PutItems for {tokens} tokens = {1000 * writes / tokens:.0f} per 1000 tokens"
        )


if __name__ == "__main__":
    main()
