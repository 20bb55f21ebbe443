"""Time to first token through the API against the engine called directly, and the AWS requests per streamed thousand
tokens (``make bench``: bench/run.py calls ``stream_run``; alone: ``PYTHONPATH=. .venv/bin/python -m bench.stream_api``).

Both sides run the CPU engine on the same prompts, one request at a time, greedy:

- direct: ``engine.generate`` started, ``texts_so_far`` looked at every 5 ms until it holds text;
- through the API: ``POST /v1/chat/completions`` with ``stream: true`` against the local stack, a warm worker (in this
  process, its engine loaded and warmed before the clock starts) running the job; the time until the first SSE chunk
  with content is read by the client. In between: the API function's submit (S3, DynamoDB, SQS), the worker's receive,
  the engine, the worker's log write (``STREAM_INTERVAL_S``) and the reader's poll (``Follow.poll_s``).

AWS requests: the worker's (counted in this process by ``bench.instruments.RequestCounter``) and the API and authorizer
functions' (recorded by moto server: ``bench.instruments.FunctionRequests``) over the streamed jobs, per 1,000 completion
tokens streamed.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time
from typing import Any

import requests

from async_inference.config import ENV_STREAM_TABLE, ServiceSettings
from async_inference.schemas import ChatCompletionRequest
from bench.instruments import API_KEY, FunctionRequests, RequestCounter, Timed, wait_until
from gpu_worker.worker import WorkerConfig
from local_runtime.functions import environment_of
from local_runtime.stack import LocalDeployment
from local_runtime.worker_thread import WorkerThread

CPU_MODEL = "SmolLM2-135M-Instruct"
PROMPTS = (
    "Tell me a story about a lighthouse.",
    "Explain how a bicycle stays upright.",
    "Write a short poem about rain.",
    "What is the capital of France, and why?",
    "Describe the taste of an apple.",
)


def _request(prompt: str, max_tokens: int) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model=CPU_MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0
    )


def direct_ttft(prompts: list[str], max_tokens: int) -> list[float]:
    """Seconds from ``generate`` to the engine's first text, per prompt (one at a time, after a warm-up)."""
    from gpu_worker.engines import make_engine

    engine = make_engine("cpu")

    async def run() -> list[float]:
        await engine.start()
        await engine.generate("warm-up", _request(prompts[0], 4))
        times = []
        for i, prompt in enumerate(prompts):
            started = time.perf_counter()
            task = asyncio.create_task(engine.generate(f"direct-{i}", _request(prompt, max_tokens)))
            first = None
            while not task.done():
                texts = engine.texts_so_far(f"direct-{i}")
                if first is None and texts and texts[0].strip():
                    first = time.perf_counter() - started
                await asyncio.sleep(0.005)
            await task
            assert first is not None, "the engine showed no text before it ended"
            times.append(first)
        await engine.close()
        return times

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def streamed(
    api_url: str, api_key: str, prompt: str, max_tokens: int, engine: Any = None
) -> tuple[float, int, str, float, float | None]:
    """One streamed chat completion through the API: seconds to its first content chunk, its completion tokens, its
    job id and when it was posted (``time.perf_counter``)."""
    body = _request(prompt, max_tokens).model_dump(exclude_none=True)
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    started, first, tokens = time.perf_counter(), None, 0
    with requests.post(
        f"{api_url}/v1/chat/completions", json=body, headers={"x-api-key": api_key}, stream=True, timeout=300
    ) as answer:
        answer.raise_for_status()
        job_id = answer.headers["x-async-inference-job-id"]
        engine_text: list[float] = []
        if engine is not None:
            threading.Thread(target=_first_text, args=(engine, job_id, engine_text), daemon=True).start()
        for line in answer.iter_lines(chunk_size=None):  # each piece as it arrives (512 would wait for more)
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: ") :])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    assert first is not None, "the stream carried no content"
    return first, tokens, job_id, started, (engine_text[0] - started if engine_text else None)


def _first_text(engine: Any, request_id: str, found: list[float], timeout_s: float = 60) -> None:
    """When ``engine`` first has text for ``request_id`` (looked at every 5 ms), appended to ``found``."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        texts = engine.texts_so_far(request_id)
        if texts and texts[0].strip():
            found.append(time.perf_counter())
            return
        time.sleep(0.005)


def stream_run(stack: LocalDeployment, api_key: str, counter: Any, max_tokens: int = 32) -> dict[str, Any]:
    """Time to first token direct and through the API (p50, each sample), and AWS requests per 1,000 streamed
    tokens; ``counter``: a ``bench.instruments.RequestCounter`` installed in this process."""
    from gpu_worker.engines import make_engine

    prompts = list(PROMPTS)
    direct = direct_ttft(prompts, max_tokens)
    assert stack.deployment is not None
    tables = [
        env[ENV_STREAM_TABLE]
        for logical_id in stack.functions
        if ENV_STREAM_TABLE in (env := environment_of(stack.deployment, logical_id))
    ]
    timed = Timed(make_engine("cpu"))
    # A worker in this process (its requests counted), writing the log its task definition names.
    config = WorkerConfig(service=ServiceSettings.load().service, receive_wait_s=20, **{ENV_STREAM_TABLE: tables[0]})
    with WorkerThread.for_engine(timed, config):
        wait_until(lambda: timed.ready, 300)
        streamed(stack.api_url, api_key, prompts[0], 4)  # the API function's and the worker's first job: warm both
        counter.reset()
        functions = FunctionRequests(stack.moto.url)
        with functions.recording():
            samples = [streamed(stack.api_url, api_key, p, max_tokens, timed.inner) for p in prompts]
            time.sleep(0.5)  # the last job's deletes and state writes
        worker_requests = counter.total("worker")
    function_requests = sum(functions.counts().values())
    through = [first for first, *_ in samples]
    tokens = sum(n for _, n, *_ in samples)
    # Where the time goes: from the POST to the engine's start (the API's submit, the worker's receive), the rest after.
    to_engine = [timed.started[job_id] - posted for _, _, job_id, posted, _ in samples]
    engine_text = [round(t, 4) if t is not None else None for *_, t in samples]
    return {
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "direct_ttft_s": [round(t, 4) for t in direct],
        "api_ttft_s": [round(t, 4) for t in through],
        "post_to_engine_start_s": [round(t, 4) for t in to_engine],
        "post_to_engine_first_text_s": engine_text,
        "direct_ttft_p50_s": statistics.median(direct),
        "api_ttft_p50_s": statistics.median(through),
        "api_added_ttft_p50_s": statistics.median(through) - statistics.median(direct),
        "streamed_tokens": tokens,
        "worker_requests": worker_requests,
        "api_requests": function_requests,
        "requests_per_1000_streamed_tokens": 1000 * (worker_requests + function_requests) / max(tokens, 1),
    }


def main() -> None:
    from local_runtime.moto_server import free_port

    counter = RequestCounter()
    os.environ["MOTO_RECORDER_FILEPATH"] = "/tmp/stream-api-moto-recording.jsonl"
    stack = LocalDeployment.with_tenants(
        {API_KEY: "bench"}, api_port=free_port(), moto_port=free_port(), workers=0, served_models=("*",)
    )
    with stack:
        stack.export_env()
        result = stream_run(stack, API_KEY, counter)
    print(
        f"time to first token, CPU engine: direct p50 {result['direct_ttft_p50_s']:.3f} s, through the API "
        f"p50 {result['api_ttft_p50_s']:.3f} s (+{result['api_added_ttft_p50_s']:.3f} s); "
        f"{result['requests_per_1000_streamed_tokens']:.0f} AWS requests per 1,000 streamed tokens"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
