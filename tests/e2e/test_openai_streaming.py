"""``stream: true`` end to end: the official ``openai`` SDK (sync and async) and LangChain, unmodified, pointed at the
local stack, each streamed request a job whose answer comes as server-sent events from its event log while the
worker decodes (lambdas/api/stream_answers.py), through the template's STREAM integrations (the streaming function).

The echo worker here takes ``DELAY_S`` to generate each answer, its words appearing at an even pace, and writes its
log every 0.25 s: a stream that only began once the job ended would be caught by the job's record.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator

import openai
import pytest
import requests

from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))
JOB_ID_HEADER = "x-async-inference-job-id"
DELAY_S = 4.0
WORDS = "one two three four five six seven eight nine ten eleven twelve"


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture
def slow_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ECHO_DELAY_S=str(DELAY_S), STREAM_INTERVAL_S="0.25")
    yield process
    stack.stop_worker(process)


def _status(stack: LocalDeployment, job_id: str) -> str:
    answer = requests.get(f"{stack.api_url}/v1/jobs/{job_id}", headers={"x-api-key": KEY_A}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()["status"]


def _chat(**extra: object) -> dict:
    return {"model": "echo-model", "messages": [{"role": "user", "content": WORDS}], **extra}


def test_a_chat_streams_its_first_words_while_the_job_still_runs(stack, sdk, slow_worker):
    # GIVEN a worker that takes DELAY_S to answer WHEN the SDK streams a chat completion
    with sdk.chat.completions.with_streaming_response.create(**_chat(stream=True)) as raw:
        job_id = raw.headers[JOB_ID_HEADER]
        statuses, text = [], ""
        for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                if not text:  # THEN the first words arrive while the job's record still reads running
                    statuses.append(_status(stack, job_id))
                text += chunk.choices[0].delta.content
    assert statuses == ["running"]
    # AND the chunks make the whole answer
    assert text == WORDS


def test_the_sync_sdk_streams_a_chat_completion_with_its_usage_last(sdk, slow_worker):
    # GIVEN a worker WHEN the SDK streams with stream_options.include_usage
    chunks = list(sdk.chat.completions.create(**_chat(stream=True, stream_options={"include_usage": True})))
    # THEN the deltas are the answer, the finish reason is stop, and the last chunk carries only the usage
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == WORDS
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(WORDS.split())


def test_the_async_sdk_streams_a_chat_completion(stack, slow_worker):
    # GIVEN a worker WHEN the async SDK streams a chat completion
    async def streamed() -> str:
        client = openai.AsyncOpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)
        text = ""
        async for chunk in await client.chat.completions.create(**_chat(stream=True)):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await client.close()
        return text

    # THEN its deltas are the answer
    assert asyncio.run(streamed()) == WORDS


def test_the_sdk_streams_a_completion(sdk, slow_worker):
    # GIVEN a worker WHEN the SDK streams a legacy completion
    chunks = list(sdk.completions.create(model="echo-model", prompt=WORDS, max_tokens=50, stream=True))
    # THEN its text chunks are the answer (the echo engine repeats the prompt) and the last has its finish reason
    assert "".join(c.choices[0].text for c in chunks if c.choices) == WORDS
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_the_sdk_streams_a_response_and_its_final_event_is_the_completed_response(sdk, slow_worker):
    # GIVEN a worker WHEN the SDK streams a Responses create
    events = list(sdk.responses.create(model="echo-model", input=WORDS, stream=True))
    # THEN the events are numbered from 0, the deltas make the answer, and the last is response.completed with it
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == WORDS
    assert events[-1].type == "response.completed" and events[-1].response.output_text == WORDS


def test_the_async_sdk_streams_a_background_response(stack, slow_worker):
    # GIVEN a worker WHEN the async SDK streams a background response
    async def streamed() -> list:
        client = openai.AsyncOpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)
        stream = await client.responses.create(model="echo-model", input=WORDS, stream=True, background=True)
        events = [event async for event in stream]
        await client.close()
        return events

    events = asyncio.run(streamed())
    # THEN it ends completed with the answer
    assert events[-1].type == "response.completed" and events[-1].response.output_text == WORDS


def test_a_dropped_response_stream_resumes_after_the_last_event_received(stack, sdk, slow_worker):
    # GIVEN a background response streamed until its first text delta, then dropped
    stream = sdk.responses.create(model="echo-model", input=WORDS, stream=True, background=True)
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()
    response_id = seen[0].response.id
    # WHEN the client resumes it after the last event it got, as the SDK's retrieve(stream=True) does
    resumed = list(sdk.responses.retrieve(response_id, stream=True, starting_after=seen[-1].sequence_number))
    # THEN the stream goes on with the next event, and the two parts make the whole answer
    assert resumed[0].sequence_number == seen[-1].sequence_number + 1
    deltas = [e.delta for e in seen + resumed if e.type == "response.output_text.delta"]
    assert "".join(deltas) == WORDS
    assert resumed[-1].type == "response.completed"


def test_every_streamed_answer_carries_the_job_id_and_is_an_event_stream(stack, slow_worker):
    # GIVEN a worker WHEN a client posts a streamed chat body as it is
    answer = requests.post(
        f"{stack.api_url}/v1/chat/completions", json=_chat(stream=True), headers={"x-api-key": KEY_A}, timeout=60
    )
    # THEN the answer is text/event-stream, names its job, and ends with [DONE]
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers[JOB_ID_HEADER].startswith("job_")
    assert answer.text.rstrip().endswith("data: [DONE]")


def test_langchain_chat_openai_streams(stack, slow_worker):
    from langchain_openai import ChatOpenAI

    # GIVEN LangChain's ChatOpenAI pointed at the stack WHEN it streams
    chat = ChatOpenAI(model="echo-model", base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)
    pieces = [chunk.content for chunk in chat.stream(WORDS)]
    # THEN its chunks make the answer, in more than one piece
    assert "".join(pieces) == WORDS
    assert len([p for p in pieces if p]) > 1


def test_a_response_that_was_not_streamed_streams_from_its_stored_result(sdk, worker):
    # GIVEN a background response created without stream, which has completed (its job wrote no event log)
    created = sdk.responses.create(model="echo-model", input=WORDS, background=True)
    deadline = time.monotonic() + 60
    while sdk.responses.retrieve(created.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    # WHEN a client reads it with stream=true
    events = list(sdk.responses.retrieve(created.id, stream=True))
    # THEN its events carry the stored answer and end completed
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == WORDS
    assert events[-1].type == "response.completed" and events[-1].response.output_text == WORDS
