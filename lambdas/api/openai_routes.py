"""OpenAI's own routes, answered from queued jobs: ``POST /v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings``, and ``POST /v1/responses`` without ``background`` (``answer_response``, called by
response_routes), so that an OpenAI client pointed at this API with only a base URL and a key works unmodified.

Each request becomes a job through the one submission path (``JobApi.submit``; a response through
``ResponseService.create``): the same queue and lanes, interactive priority, tenant quotas, the wake from zero,
Idempotency-Key and notifications. The connection is then held while the job runs (``async_inference.sync_wait``) and
the answer is the job's result, OpenAI's object. Every answer to a request that made a job carries its id in the
``JOB_ID_HEADER`` header; past ``sync_wait.MAX_WAIT_S`` the answer is a 504 ``job_still_running`` naming the job, which
goes on (docs/openai-routes.md).
"""

# No `from __future__ import annotations`: Powertools reads the route signatures at run time (see handler.py).
import json
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Annotated, Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.event_handler import Response as HttpResponse
from aws_lambda_powertools.event_handler import content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Header
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from pydantic import ValidationError

from async_inference import settings
from async_inference.aws import PayloadTooLarge
from async_inference.jobs import JobStatus
from async_inference.jobs_service import ErrorKind, JobApi, ServiceError, describe_validation_error
from async_inference.response_service import ResponseService
from async_inference.responses import job_id_of
from async_inference.schemas import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    ChatCompletion,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    Job,
    JobSubmission,
    TextCompletion,
    text_completion,
)
from async_inference.schemas.responses import ResponseCreate
from async_inference.sync_wait import MAX_WAIT_S, JobWait, preferred_wait_s
from lambdas.api import stream_answers
from lambdas.api.openapi_document import JOB_ID, JOB_ID_HEADER, error_responses, ok
from lambdas.api.tenancy import tenant_of

# The routes have no return annotation: Powertools would validate the answer against it, and the answer is the job's
# stored result as it was written (or the error envelope), passed through unparsed.
router = Router()
metrics = Metrics()  # Powertools' metrics are one set per process: the handler's log_metrics flushes these too
jobs: JobApi | None = None  # set once by configure(), to the handler's JobApi
responses: ResponseService | None = None
waiter: JobWait | None = None

# OpenAI's SDKs retry 408, 409, 429 and 5xx unless this header says not to; a retry would queue the same request as
# a second job, so it is sent with every error that names a job.
SHOULD_RETRY_HEADER = "x-should-retry"
# A Lambda function's answer is at most 6 MB: a larger result is read from the job (GET /v1/jobs/{id}).
MAX_ANSWER_BYTES = 6 * 1024 * 1024 - 64 * 1024
# Routes with a JSON body: handler.body_checks sizes and types it.
BODY_ROUTES = {CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, EMBEDDINGS_ENDPOINT}

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="idempotency-key",
        min_length=1,
        max_length=255,
        description="Retrying with the same key waits on the same job instead of queueing another.",
    ),
]
HELD_DESCRIPTION = (
    "The request runs as a job (interactive priority, the tenant's quotas) and the connection is held until it ends, "
    f"at most {MAX_WAIT_S} s. The answer carries the job's id in the `{JOB_ID_HEADER}` header."
)


_ANSWER_ERRORS = error_responses(
    400,
    415,
    422,
    503,
    e404="`model_not_found`: this deployment does not serve that model (GET /v1/models lists them)",
    e409="`idempotency_key_in_progress`, or `job_cancelled`: the job was cancelled while the request waited",
    e429="`quota_exceeded`: the tenant has `max_active_jobs` unfinished jobs, or is over its usage plan",
    e500="`server_error`: the job failed for a reason that is not the request's (the message names the job)",
    e504=f"`job_still_running`: the job did not end within {MAX_WAIT_S} s; it goes on (GET /v1/jobs/{{id}})",
)


def _documented(description: str, model: Any) -> dict[int, Any]:
    """What a held route answers: ``model`` once its job succeeded, the errors of a job that did not."""
    return {200: ok(description, model, headers=JOB_ID), **_ANSWER_ERRORS}


def configure(api: JobApi) -> None:
    global jobs, responses, waiter
    jobs = api
    responses = ResponseService(api)
    waiter = JobWait(api.store)
    stream_answers.configure(api)


def _jobs() -> JobApi:
    assert jobs is not None, "openai_routes.configure() was not called"
    return jobs


def _tenant() -> str:
    event = router.current_event
    assert isinstance(event, APIGatewayProxyEvent)  # what the REST API's resolver (the handler's app) makes
    return tenant_of(event)


def _waiter() -> JobWait:
    assert waiter is not None, "openai_routes.configure() was not called"
    return waiter


@router.post(
    CHAT_ENDPOINT,
    summary="Create a chat completion (OpenAI's), answered from a queued job",
    description=HELD_DESCRIPTION,
    responses=_documented("The chat.completion", ChatCompletion),
)
def create_chat_completion(request: Annotated[ChatCompletionRequest, Body()], idempotency_key: IdempotencyKey = None):
    submission = JobSubmission.model_validate({"request": request})
    if request.stream:
        return stream_answers.chat(_submitted(submission, idempotency_key), request)
    return _answer(_held(submission, idempotency_key))


@router.post(
    COMPLETIONS_ENDPOINT,
    summary="Create a text completion (OpenAI's legacy completions), answered from a queued job",
    description=HELD_DESCRIPTION
    + " The prompt runs as the chat request that continues it verbatim, as batch lines do.",
    responses=_documented("The text_completion", TextCompletion),
)
def create_completion(request: Annotated[CompletionRequest, Body()], idempotency_key: IdempotencyKey = None):
    try:
        chat = request.to_chat()
    except ValidationError as exc:  # a limit of the chat request the completions model does not repeat (stop: 4)
        message, details = describe_validation_error(exc)
        raise ServiceError(ErrorKind.INVALID, "invalid_request", message, details) from exc
    submission = JobSubmission.model_validate({"endpoint": COMPLETIONS_ENDPOINT, "request": chat})
    if chat.stream:
        return stream_answers.completion(_submitted(submission, idempotency_key), chat)
    job = _held(submission, idempotency_key)
    return _answer(job, convert=_text_completion)


@router.post(
    EMBEDDINGS_ENDPOINT,
    summary="Create embeddings (OpenAI's), answered from a queued job",
    description=HELD_DESCRIPTION,
    responses=_documented("The embedding list", EmbeddingList),
)
def create_embeddings(request: Annotated[EmbeddingRequest, Body()], idempotency_key: IdempotencyKey = None):
    submission = JobSubmission.model_validate({"endpoint": EMBEDDINGS_ENDPOINT, "request": request})
    return _answer(_held(submission, idempotency_key))


def answer_response(request: ResponseCreate, idempotency_key: str | None) -> HttpResponse:
    """``POST /v1/responses`` without ``background``: the response's job, held until it ends; the Response."""
    assert responses is not None, "openai_routes.configure() was not called"
    tenant, started = _tenant(), time.monotonic()
    if request.stream:
        stream_answers.check_available()
    created = responses.create(tenant, request, idempotency_key)
    if request.stream:  # background or not: the events while it runs; a background one goes on if the client leaves
        job = _jobs().get(tenant, job_id_of(created.id))
        return stream_answers.response(job, created.model_dump(mode="json"))
    job = _wait(job_id_of(created.id), started)
    if job.status is not JobStatus.SUCCEEDED:
        return _unanswered(job)
    answer = responses.retrieve(tenant, created.id)
    return _ok(job, answer.model_dump_json().encode())


def resume_response(response_id: str, starting_after: int | None) -> HttpResponse:
    """``GET /v1/responses/{id}?stream=true``: the response's events from its job's event log, after
    ``starting_after``; the response echoed in the first events is the one created (queued, no output yet)."""
    assert responses is not None, "openai_routes.configure() was not called"
    current = responses.retrieve(_tenant(), response_id)
    job = _jobs().get(_tenant(), job_id_of(response_id))
    created = current.model_copy(
        update={
            "status": "queued",
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
            "completed_at": None,
        }
    )
    return stream_answers.response(job, created.model_dump(mode="json"), starting_after)


def _text_completion(job: Job, body: bytes) -> bytes:
    """A completions job's chat.completion as OpenAI's text_completion (``cmpl-`` and the job's hex digits)."""
    completion = ChatCompletion.model_validate_json(body)
    answer = text_completion(completion, completion_id="cmpl-" + job.job_id.removeprefix("job_"))
    return answer.model_dump_json().encode()


# --- Holding and answering ------------------------------------------------------------------------------------------


def _held(submission: JobSubmission, idempotency_key: str | None) -> Job:
    """Submit the job as POST /v1/jobs does (interactive priority) and wait for it: the job as it then stands."""
    started = time.monotonic()
    return _wait(_submitted(submission, idempotency_key).job_id, started)


def _submitted(submission: JobSubmission, idempotency_key: str | None) -> Job:
    """Submit the job as POST /v1/jobs does (interactive priority): the job as submitted."""
    if submission.request is not None and getattr(submission.request, "stream", False):
        stream_answers.check_available()  # before a job is made that nobody could read
    submitted = _jobs().submit(_tenant(), submission, idempotency_key)
    if submitted.created:
        metrics.add_metric(name=settings.METRIC_JOBS_SUBMITTED, unit=MetricUnit.Count, value=1)
    return submitted.job


def _wait(job_id: str, started: float) -> Job:
    job = _waiter().until_final(job_id, MAX_WAIT_S - (time.monotonic() - started))
    assert job is not None, f"job {job_id} vanished while its request waited"  # records outlive any request
    return job


def _answer(job: Job, convert: Callable[[Job, bytes], bytes] | None = None) -> HttpResponse:
    """The job's result object as the answer, or the error that says why there is none."""
    if job.status is not JobStatus.SUCCEEDED or not job.result_key:
        return _unanswered(job)
    try:
        body = _jobs().blobs.get(job.result_key, max_bytes=MAX_ANSWER_BYTES)
    except KeyError as exc:
        raise ServiceError(ErrorKind.GONE, "result_expired", f"the result of job {job.job_id} is gone") from exc
    except PayloadTooLarge:
        message = (
            f"the result of job {job.job_id} is larger than one answer can carry; read it from GET /v1/jobs/"
            f"{job.job_id} (its result URL)"
        )
        return _error(job, HTTPStatus.INTERNAL_SERVER_ERROR, "result_too_large", message)
    if convert is not None:
        body = convert(job, body)
    return _ok(job, body)


def _ok(job: Job, body: bytes) -> HttpResponse:
    return HttpResponse(
        status_code=HTTPStatus.OK,
        content_type=content_types.APPLICATION_JSON,
        body=body.decode(),
        headers={JOB_ID_HEADER: job.job_id},
    )


def _unanswered(job: Job) -> HttpResponse:
    """Why a held request has no result: its job failed (a client error when the failure was the request's), was
    cancelled or expired, or is still running when the wait is over."""
    if job.status is JobStatus.FAILED:
        reason = job.error or "no reason recorded"
        if job.error_code is not None:  # the request's fault (context_length_exceeded): the client fixes it
            return _error(job, HTTPStatus.BAD_REQUEST, job.error_code, reason)
        return _error(job, HTTPStatus.INTERNAL_SERVER_ERROR, "server_error", f"job {job.job_id} failed: {reason}")
    if job.status is JobStatus.CANCELLED:
        return _error(job, HTTPStatus.CONFLICT, "job_cancelled", f"job {job.job_id} was cancelled")
    if job.status is JobStatus.EXPIRED:
        message = f"job {job.job_id} expired before a worker ran it: {job.error or 'its deadline passed'}"
        return _error(job, HTTPStatus.GATEWAY_TIMEOUT, "job_expired", message)
    message = (
        f"job {job.job_id} did not end within {MAX_WAIT_S} s and goes on: read its result from GET /v1/jobs/"
        f"{job.job_id} (or be told by a webhook or the WebSocket API); sending this request again queues another job"
    )
    return _error(job, HTTPStatus.GATEWAY_TIMEOUT, "job_still_running", message, location=True)


def _error(job: Job, status: int, code: str, message: str, *, location: bool = False) -> HttpResponse:
    headers = {JOB_ID_HEADER: job.job_id, SHOULD_RETRY_HEADER: "false"}
    if location:
        headers["Location"] = f"/v1/jobs/{job.job_id}"
    body = {"error": {"code": code, "message": message, "details": [], "job_id": job.job_id}}
    return HttpResponse(
        status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body), headers=headers
    )


def prefer_wait(job: Job, prefer: str | None, started: float) -> tuple[Job, dict[str, str]]:
    """``POST /v1/jobs`` with ``Prefer: wait=N`` (RFC 7240): the job once final, or as it stands after N seconds
    (at most ``MAX_WAIT_S``), and the answer's headers (the job id; ``Preference-Applied`` when it waited)."""
    headers = {JOB_ID_HEADER: job.job_id}
    wait_s = preferred_wait_s(prefer)
    if wait_s is None or job.status is not JobStatus.QUEUED:  # an upload job waits for its upload, not for this
        return job, headers
    headers["Preference-Applied"] = f"wait={int(wait_s)}"
    return _waiter().until_final(job.job_id, wait_s - (time.monotonic() - started)) or job, headers
