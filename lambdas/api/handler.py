"""The ingestion API: a thin adapter from API Gateway proxy events to the job service's API side (``JobApi``).

Routes validate their input with the core schemas (Powertools' OpenAPI validation), and the same models generate the
OpenAPI document served at ``/v1/openapi.json``, so the document cannot drift from what is enforced. Every error leaves
as ``{"error": {"code", "message", "details"}}``; no exception text or stack trace reaches the client.
"""

# No `from __future__ import annotations` here: Powertools reads the route signatures at run time to validate and
# to build the OpenAPI document, and string annotations behind the tracer's wrapper do not resolve.
import base64
import binascii
import json
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Annotated, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestUnsupportedContentType, RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.middleware_factory import lambda_handler_decorator
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import safe_json, settings
from async_inference.config import ServiceSettings
from async_inference.jobs import FINAL_STATES, JOB_ID_PATTERN, JobStatus
from async_inference.jobs_service import JobService, ServiceError
from async_inference.schemas import JobList, JobSubmission, JobView, error_location, error_message
from async_inference.sync_wait import MAX_WAIT_S
from lambdas.api import batch_routes, errors, media_type, openai_routes, response_routes
from lambdas.api.openapi_document import RETRY_AFTER, SECURITY, SECURITY_SCHEMES, error_responses, ok, served
from lambdas.api.tenancy import tenant_of

logger = Logger()
tracer = Tracer()
metrics = Metrics()
# Bodies are parsed by the one safe loader (nesting and number limits): json.loads would raise RecursionError on a body
# nested 50,000 deep, a 500. Its UnsafeJson is a JSONDecodeError, which the validation middleware makes a 400.
app = APIGatewayRestResolver(enable_validation=True, json_body_deserializer=safe_json.loads)
app.enable_swagger(path="/v1/docs", title="Async inference API", version="1")

config = ServiceSettings.load()
jobs = JobService.from_config(
    config.service,
    allow_local_webhooks=config.allow_local_webhooks,
    served_models=config.served_models,
    quotas=config.tenant_quotas,
    limits=config.request_limits,
).api
batch_routes.configure(config)
app.include_router(batch_routes.router)
response_routes.configure(jobs)
app.include_router(response_routes.router)
openai_routes.configure(jobs)
app.include_router(openai_routes.router)

JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="A job id as returned by POST /v1/jobs.")]
MAX_IDEMPOTENCY_KEY_CHARS = 255
FORM_OVERHEAD_BYTES = 16 * 1024  # a multipart body's boundaries and part headers around the file
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="idempotency-key",
        min_length=1,
        max_length=MAX_IDEMPOTENCY_KEY_CHARS,
        description="Retrying a POST with the same key returns the same job; the same key with a different request "
        "is a 422 (409 while the first request is still being processed).",
    ),
]
Prefer = Annotated[
    str | None,
    Header(
        alias="prefer",
        max_length=256,
        description=f"RFC 7240 `wait=N`: hold the request up to N seconds (at most {MAX_WAIT_S}) while the job runs; "
        "the answer is then the job as it stands (200 once it has ended), with `Preference-Applied`.",
    ),
]


# Routes that read a request body; the others ignore any body sent (HTTP gives a GET's body no meaning).
_BODY_ROUTES = {
    ("POST", "/v1/jobs"),
    ("POST", "/v1/batches"),
    ("POST", "/v1/files/uploads"),
    ("POST", response_routes.CREATE_ROUTE),
    *(("POST", route) for route in openai_routes.BODY_ROUTES),
}


def _error(status: int, code: str, message: str, details: list[dict[str, str]] | None = None) -> Response:
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=json.dumps(body))


def _json(status: int, model: Any) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=model)


def _tenant() -> str:
    """The caller's tenant, from the authorizer that checked its API key. Never from the request itself."""
    tenant = tenant_of(app.current_event)
    logger.append_keys(tenant=tenant)
    return tenant


@app.post(
    "/v1/jobs",
    summary="Submit a job",
    description='`priority` picks the lane: `"interactive"` (default) queues the job on the job queue; `"batch"` on the '
    "batch lane, where it runs in the engine slots interactive jobs leave free and yields its slot to them.",
    responses={
        202: ok("Queued (an inline `request`)", JobView),
        200: ok("Ended while a `Prefer: wait=N` request waited", JobView),
        201: ok("Awaiting its upload (an `upload`): PUT the request to `upload.url`", JobView),
        **error_responses(
            400,
            415,
            422,
            503,
            e404="`model_not_found`: the request names a model this deployment does not serve (GET /v1/models)",
            e409="`idempotency_key_in_progress`: a request with this Idempotency-Key and another body is still being "
            "processed; retry in a few seconds",
            e413="`payload_too_large`: the body is over the inline limit (use an upload job) or API Gateway's 10 MB",
            e429="`quota_exceeded`: the tenant has `max_active_jobs` unfinished jobs (the message names the limit), "
            "or is over its usage plan's rate or daily quota (API Gateway)",
        ),
    },
)
@tracer.capture_method(capture_response=False)
def create_job(
    submission: Annotated[JobSubmission, Body()], idempotency_key: IdempotencyKey = None, prefer: Prefer = None
) -> Response[JobView]:
    started = time.monotonic()
    submitted = jobs.submit(_tenant(), submission, idempotency_key)
    if submitted.created:
        metrics.add_metric(name=settings.METRIC_JOBS_SUBMITTED, unit=MetricUnit.Count, value=1)
    job, headers = openai_routes.prefer_wait(submitted.job, prefer, started)
    status = HTTPStatus.CREATED if submitted.upload else HTTPStatus.ACCEPTED
    if "Preference-Applied" in headers and job.status in FINAL_STATES:
        status = HTTPStatus.OK
    view = jobs.view(job, upload=submitted.upload)
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=view, headers=headers)


@app.get(
    "/v1/jobs/<job_id>",
    summary="Get a job's status and result",
    responses={200: ok("The job", JobView, headers=RETRY_AFTER), **error_responses(400, 404, 410)},
)
@tracer.capture_method(capture_response=False)
def get_job(job_id: JobId) -> Response[JobView]:
    view, poll_after_s = jobs.read(_tenant(), job_id)
    # Retry-After on a 200: how long a poller should wait before the next GET (the SDK follows it).
    headers = {"Retry-After": str(poll_after_s)} if poll_after_s is not None else None
    return Response(status_code=HTTPStatus.OK, content_type=content_types.APPLICATION_JSON, body=view, headers=headers)


@app.get(
    "/v1/jobs",
    summary="List your jobs, newest first",
    responses={200: ok("A page of jobs", JobList), **error_responses(400)},
)
@tracer.capture_method(capture_response=False)
def list_jobs(
    status: Annotated[JobStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=settings.MAX_PAGE_SIZE)] = settings.DEFAULT_PAGE_SIZE,
    next: Annotated[str | None, Query(max_length=2048)] = None,
) -> Response[JobList]:
    page, token = jobs.list(_tenant(), status=status, limit=limit, next_token=next)
    return _json(HTTPStatus.OK, JobList(jobs=[jobs.view(j) for j in page], next=token))


@app.post(
    "/v1/jobs/<job_id>/cancel",
    summary="Cancel a job that has not finished",
    responses={
        200: ok("The cancelled job", JobView),
        **error_responses(400, 404, e409="`conflict`: the job is already final"),
    },
)
@tracer.capture_method(capture_response=False)
def cancel_job(job_id: JobId) -> Response[JobView]:
    return _json(HTTPStatus.OK, jobs.view(jobs.cancel(_tenant(), job_id)))


@app.get("/v1/openapi.json", summary="This API's OpenAPI document", include_in_schema=False)
def openapi():  # no return annotation: Powertools would try to validate the document against it
    document = served(
        app.get_openapi_json_schema(
            title="Async inference API", version="1", security_schemes=SECURITY_SCHEMES, security=SECURITY
        )
    )
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=json.dumps(document))


# --- Errors: mapped to responses in one place -----------------------------------------------------------------------


@app.exception_handler(ServiceError)
def _api_error(exc: ServiceError) -> Response:
    status = errors.status_of(exc.kind)
    if status >= 500:
        logger.error("service unavailable", extra={"code": exc.code})
    return _error(status, exc.code, exc.message, exc.details)


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response:
    details = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            return _error(400, "invalid_json", "the request body is refused: " + error.get("ctx", {}).get("error", ""))
        field = error_location(error, skip=("body", "query", "path", "header"))
        details.append({"field": field, "message": error_message(error)})
    first = details[0] if details else {"field": "(body)", "message": "invalid"}
    return _error(400, "invalid_request", f"{first['field']}: {first['message']}", details)


@app.exception_handler(RequestUnsupportedContentType)
def _unsupported_media_type(exc: RequestUnsupportedContentType) -> Response:
    # Reached for a non-JSON type on an empty body (a body is refused before routing, in body_checks).
    content_type = app.current_event.headers.get("content-type")
    return _error(415, "unsupported_media_type", media_type.refusal(content_type, has_body=True) or str(exc))


@app.exception_handler(NotFoundError)
def _no_route(exc: NotFoundError) -> Response:
    return _error(404, "not_found", f"no route {app.current_event.http_method} {app.current_event.path}")


@app.exception_handler(Exception)
def _unexpected(exc: Exception) -> Response:
    # The full error goes to the log with the request id; the client gets neither the text nor the trace.
    logger.exception("unhandled error")
    return _error(500, "internal_error", "internal error; the request id is in the x-amzn-requestid response header")


def _raw_error(status: int, code: str, message: str) -> dict[str, Any]:
    body = {"error": {"code": code, "message": message, "details": []}}
    return {"statusCode": status, "headers": {"Content-Type": "application/json"}, "body": json.dumps(body)}


@lambda_handler_decorator
def body_checks(handler: Callable[..., Any], event: dict[str, Any], context: LambdaContext) -> Any:
    """Refuse oversize bodies, bodies that are not JSON, and bodies that are not UTF-8 text before anything parses
    them, on the routes that read a JSON body; a file upload (multipart, maybe binary) has its own size limit."""
    if batch_routes.is_file_upload(event):
        body = event.get("body") or ""
        try:
            raw_size = (
                len(base64.b64decode(body, validate=True)) if event.get("isBase64Encoded") else len(body.encode())
            )
        except binascii.Error:
            return _raw_error(400, "invalid_request", "the request body is not valid base64")
        if raw_size > settings.MAX_FILE_INLINE_BYTES + FORM_OVERHEAD_BYTES:
            message = (
                f"the file is larger than the {settings.MAX_FILE_INLINE_BYTES} bytes POST /v1/files takes; use "
                "POST /v1/files/uploads (a presigned PUT) for large files"
            )
            return _raw_error(413, "payload_too_large", message)
        return handler(event, context)
    if (event.get("httpMethod"), event.get("resource")) not in _BODY_ROUTES:
        return handler(event, context)
    body = event.get("body") or ""
    try:
        raw = base64.b64decode(body, validate=True) if event.get("isBase64Encoded") else body.encode()
    except binascii.Error:
        return _raw_error(400, "invalid_request", "the request body is not valid base64")
    if len(raw) > settings.MAX_INLINE_REQUEST_BYTES:
        message = (
            f"the body is larger than {settings.MAX_INLINE_REQUEST_BYTES} bytes; use an upload job for large requests"
        )
        return _raw_error(413, "payload_too_large", message)
    unsupported = media_type.normalize(event)
    if unsupported is not None:
        return _raw_error(415, "unsupported_media_type", unsupported)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return _raw_error(400, "invalid_json", "the request body is not UTF-8 text; send a JSON object")
    return handler(event, context)


# clear_state: keys appended for one request (the tenant) must not stay on the warm function's logger for the next.
@logger.inject_lambda_context(correlation_id_path="requestContext.requestId", clear_state=True)
# capture_response=False here and on every route: answers hold presigned URLs (signature, session token), which X-Ray
# would keep for anyone with read access to traces (docs/security.md).
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics
@body_checks
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
