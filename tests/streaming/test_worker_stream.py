"""A worker configured from the template streams a job through the log the template declares: the first chunk is read
while the job is still running, and the stream ends with the answer the job stores.

The stack is the fault tests' (the synthesized template deployed to moto, no worker processes); the worker runs in
this process from the task definition's environment, as ``python -m gpu_worker`` reads it. The request schema refuses
``stream: true`` until the OpenAI routes take it, so the stored body is read as a streamed request here: that one
seam aside, everything is the deployed path (template, worker settings, runner hook, writer, table, reader).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from openai.types.chat import ChatCompletionChunk

from async_inference.config import ENV_STREAM_TABLE
from async_inference.jobs import JobStatus
from async_inference.jobs_service import parse_request_body
from async_inference.streaming import EventLog, Follow, chat_completion_chunks, end_of, follow
from gpu_worker.__main__ import batch_store
from gpu_worker.config import WorkerSettings
from gpu_worker.engines.echo import EchoEngine
from gpu_worker.worker import Worker
from local_runtime.worker_thread import WorkerThread
from tests.faults.fault_stack import FaultStack, chat
from tests.streaming.sdk import parse

WORDS = " ".join(f"word{i}" for i in range(30))


@pytest.fixture(scope="module")
def fstack(tmp_path_factory: pytest.TempPathFactory, local_assembly: Path) -> Iterator[FaultStack]:
    stack = FaultStack(tmp_path_factory.mktemp("stream-logs"), local_assembly).start()
    saved = dict(os.environ)
    os.environ.update(stack.env)  # the in-process worker's clients find moto as the worker process's do
    try:
        yield stack
    finally:
        os.environ.clear()
        os.environ.update(saved)
        stack.stop()


def streamed(raw: bytes, endpoint: str | None = None):
    request, reason = parse_request_body(raw, endpoint)
    return (request.model_copy(update={"stream": True}) if request is not None else None), reason


def test_a_worker_of_the_template_streams_a_job_while_it_runs(fstack: FaultStack):
    # GIVEN the worker settings of the deployed task definition (the template names the log table)
    assert fstack.local.fleet is not None
    environment = {**fstack.local.fleet.environment(), "RECEIVE_WAIT_S": "1", "HEARTBEAT_INTERVAL_S": "0.5"}
    with mock.patch.dict(os.environ, environment, clear=True):
        settings = WorkerSettings.load()
    config = settings.worker_config()
    assert config.stream_table_name == environment[ENV_STREAM_TABLE]
    log = EventLog(config.stream_table_name)
    # WHEN a streamed job runs on it, 3 s of decoding, and a reader follows its log
    engine = EchoEngine(delay_s=3.0)
    with (
        mock.patch("gpu_worker.runner.parse_request_body", streamed),
        WorkerThread(Worker(config, engine, batches=batch_store(settings))),
    ):
        job_id = fstack.api().submit(chat(WORDS, max_tokens=30)).job_id
        first: tuple[float, JobStatus] | None = None
        text = ""
        segments = follow(log, job_id, ended=lambda: end_of(fstack.job(job_id)), how=Follow(max_wait_s=60))
        for frame in chat_completion_chunks(segments, completion_id="c", model="echo-model"):
            for chunk in parse([frame], ChatCompletionChunk):
                if chunk.choices and chunk.choices[0].delta.content:
                    if first is None:
                        first = (time.monotonic(), fstack.job(job_id).status)
                    text += chunk.choices[0].delta.content
        final = fstack.wait_final([job_id])[job_id]
    # THEN the first chunk was read while the job was still running, and the chunks are the stored answer's text
    assert first is not None and first[1] is JobStatus.RUNNING, f"first chunk read when the job was {first}"
    assert final.status is JobStatus.SUCCEEDED and text == WORDS
