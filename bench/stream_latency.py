"""What the event log adds to the time to first token: for each streamed job, when the engine first has text
(``texts_so_far``, looked at every 5 ms) against when a reader following the log (``follow``, the API's poll) gets its
first content chunk. The log is a DynamoDB table on a local moto server, so AWS's own request latency (single-digit
milliseconds for PutItem and Query in a region) is not in it.

    PYTHONPATH=. .venv/bin/python -m bench.stream_latency [echo|cpu] [jobs]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import threading
import time
from typing import Any

from async_inference.aws import client
from async_inference.streaming import EventLog, Follow, chat_completion_chunks, follow
from async_inference.streaming import log as layout
from bench.stream_writes import running_job, streamed_request
from gpu_worker.deltas import DeltaWriter
from gpu_worker.engines.base import Engine
from gpu_worker.engines.echo import EchoEngine
from local_runtime.moto_server import LOCAL_CREDENTIALS, MotoServer, free_port


def _table() -> EventLog:
    dynamodb = client("dynamodb")
    dynamodb.create_table(
        TableName="bench-streams",
        KeySchema=[
            {"AttributeName": layout.PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": layout.SORT_KEY, "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": layout.PARTITION_KEY, "AttributeType": "S"},
            {"AttributeName": layout.SORT_KEY, "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return EventLog("bench-streams", dynamodb)


async def _io(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


async def added_latency(engine: Engine, log: EventLog, job_id: str, prompt: str, max_tokens: int) -> float:
    """Seconds from the engine's first text to the reader's first content chunk, for one streamed job."""
    job, request = running_job(job_id), streamed_request(prompt, max_tokens)
    writer = DeltaWriter(engine, log, io=_io)
    writer.track(job, request)
    first_chunk: list[float] = []

    def read() -> None:
        segments = follow(log, job_id, ended=lambda: None, how=Follow())
        for frame in chat_completion_chunks(segments, completion_id="c", model="m"):
            if '"content":"' in frame and '"content":""' not in frame and not first_chunk:
                first_chunk.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pump = asyncio.create_task(writer.run())
    task = asyncio.create_task(engine.generate(job_id, request))
    first_text = None
    while not task.done():
        texts = engine.texts_so_far(job_id)
        if first_text is None and texts and texts[0].strip():
            first_text = time.monotonic()
        await asyncio.sleep(0.005)
    generation = await task
    writer.forget(job_id)
    await writer.ended(job, generation)
    pump.cancel()
    await asyncio.to_thread(reader.join, 60)
    assert first_text is not None and first_chunk, "no text seen"
    return first_chunk[0] - first_text


def main() -> None:
    kind = sys.argv[1] if len(sys.argv) > 1 else "echo"
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    server = MotoServer(free_port()).start()
    os.environ.update(LOCAL_CREDENTIALS, AWS_ENDPOINT_URL=server.url)
    try:
        log = _table()

        async def run_all() -> list[float]:
            if kind == "cpu":
                from gpu_worker.engines.cpu import CpuEngine

                engine: Engine = CpuEngine(capacity=2, max_model_len=2048)
                await engine.start()
            else:
                engine = EchoEngine(delay_s=2.0)
            words = " ".join(f"w{i}" for i in range(100))
            try:
                return [
                    await added_latency(engine, log, f"job_b{i}", words if kind == "echo" else "Tell me a story.", 24)
                    for i in range(jobs)
                ]
            finally:
                await engine.close()

        added = asyncio.run(run_all())
    finally:
        server.stop()
    added.sort()
    print(
        f"{kind} engine, {jobs} streamed jobs: the log adds p50 {statistics.median(added):.3f} s, "
        f"p90 {added[int(0.9 * (len(added) - 1))]:.3f} s, max {added[-1]:.3f} s to the first token"
    )


if __name__ == "__main__":
    main()
