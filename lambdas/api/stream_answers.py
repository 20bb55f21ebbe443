"""The streamed answers of OpenAI's routes: a job's event log as OpenAI's server-sent events (docs/streaming.md).

A request with ``stream: true`` is submitted as a job like any other (lambdas/api/openai_routes.py); the answer is then
``200 text/event-stream`` whose body is an iterator of SSE frames, read from the job's event log while the worker
decodes (``async_inference.streaming``). The handler returns it as a Lambda proxy response with that iterator as its
body: the streaming function (Lambda Web Adapter in response-stream mode on AWS, the local gateway's stream invocation
locally) sends each frame as it comes. Every answer carries the job id header; the job goes on whether or not the
client stays (a dropped Responses stream resumes with ``GET /v1/responses/{id}?stream=true&starting_after=N``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import Response as HttpResponse

from async_inference.aws import PayloadTooLarge
from async_inference.config import ENV_STREAM_TABLE
from async_inference.jobs import JobStatus
from async_inference.jobs_service import ErrorKind, JobApi, ServiceError
from async_inference.schemas import ChatCompletionRequest, Job
from async_inference.streaming import (
    MEDIA_TYPE,
    End,
    EventLog,
    chat_completion_chunks,
    completion_chunks,
    end_of,
    follow,
    response_events,
)
from lambdas.api.openapi_document import JOB_ID_HEADER

# Read once per process, as every setting; the API function's environment names the table (cdk/job_streams.py).
_log: EventLog | None = None
_jobs: JobApi | None = None
# The stored result read for an end the log lacks; a stream's whole answer is far smaller (a Lambda answer's 6 MB).
MAX_RESULT_BYTES = 6 * 1024 * 1024


def configure(jobs: JobApi, table_name: str | None = None) -> None:
    """The log the streams are read from: ``table_name``, else the function's ``JOB_STREAM_TABLE_NAME``; without one,
    a streamed request is a 400 (this deployment has no log to stream from)."""
    global _log, _jobs
    _jobs = jobs
    name = table_name or os.environ.get(ENV_STREAM_TABLE)
    _log = EventLog(name) if name else None


def check_available() -> None:
    """Refuse ``stream: true`` before a job is made when there is no log to stream it from."""
    if _log is None:
        message = "stream: this deployment has no job event log to stream from; omit stream (or send false)"
        raise ServiceError(ErrorKind.INVALID, "invalid_request", message, [{"field": "stream", "message": message}])


def chat(job: Job, request: ChatCompletionRequest) -> HttpResponse:
    """``POST /v1/chat/completions`` with ``stream: true``: ``chat.completion.chunk`` events, ``[DONE]`` last."""
    frames = chat_completion_chunks(
        _segments(job.job_id),
        completion_id="chatcmpl-" + _suffix(job),
        model=request.model,
        created=_created(job),
        n=request.n,
        include_usage=_include_usage(request),
    )
    return _stream(job, frames)


def completion(job: Job, request: ChatCompletionRequest) -> HttpResponse:
    """``POST /v1/completions`` with ``stream: true`` (``request`` is the chat request it runs as): ``text_completion``
    events, ``[DONE]`` last."""
    frames = completion_chunks(
        _segments(job.job_id),
        completion_id="cmpl-" + _suffix(job),
        model=request.model,
        created=_created(job),
        include_usage=_include_usage(request),
    )
    return _stream(job, frames)


def response(job: Job, response: dict[str, Any], starting_after: int | None = None) -> HttpResponse:
    """A response's Responses events (``response`` as it was created: echoed in ``response.created``), numbered by
    ``sequence_number``; those up to ``starting_after`` are not sent."""
    frames = response_events(_segments(job.job_id), response=response, starting_after=starting_after)
    return _stream(job, frames)


def _stream(job: Job, frames: Iterator[str]) -> HttpResponse:
    # Powertools passes a body that is not JSON through unserialized: the iterator reaches the streaming function.
    body: Any = frames
    return HttpResponse(
        status_code=HTTPStatus.OK,
        content_type=MEDIA_TYPE,
        body=body,
        headers={JOB_ID_HEADER: job.job_id, "Cache-Control": "no-cache"},
    )


def _segments(job_id: str) -> Iterator[Any]:
    check_available()
    assert _log is not None and _jobs is not None
    return follow(_log, job_id, ended=_ended(_jobs, job_id))


def _ended(jobs: JobApi, job_id: str) -> Callable[[], End | None]:
    """The job's end as its record and stored result tell it: for an end the worker did not write to the log (a job
    cancelled through the API, dead-lettered, not streamed, or whose log expired)."""

    def ended() -> End | None:
        job = jobs.store.get(job_id)  # the stream's job, already the tenant's
        if job is None:
            return End(status="failed", error=f"job {job_id} is gone (deleted)")
        result = None
        if job.status is JobStatus.SUCCEEDED and job.result_key:
            try:
                result = json.loads(jobs.blobs.get(job.result_key, max_bytes=MAX_RESULT_BYTES))
            except (KeyError, PayloadTooLarge):
                result = None  # end_of says the result is gone: GET /v1/jobs/{id} reads it
        return end_of(job, result)

    return ended


def _suffix(job: Job) -> str:
    return job.job_id.removeprefix("job_")


def _created(job: Job) -> int:
    return int(job.created_at.timestamp())


def _include_usage(request: ChatCompletionRequest) -> bool:
    return bool(request.stream_options and request.stream_options.include_usage)
