"""The ingestion API: a thin adapter from API Gateway proxy events to ``JobService``.

Routes validate their input with the core schemas (Powertools' OpenAPI validation), and the same models generate the
OpenAPI document served at ``/v1/openapi.json``, so the document cannot drift from what is enforced. Every error leaves
as ``{"error": {"code", "message", "details"}}``; no exception text or stack trace reaches the client.
"""

# No `from __future__ import annotations` here: Powertools reads the route signatures at run time to validate and
# to build the OpenAPI document, and string annotations behind the tracer's wrapper do not resolve.
import base64
import binascii
import json
from http import HTTPStatus
from typing import Annotated, Any, Callable, Optional

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.middleware_factory import lambda_handler_decorator
from aws_lambda_powertools.utilities.typing import LambdaContext

from async_inference import settings
from async_inference.config import ServiceSettings
from async_inference.jobs import JOB_ID_PATTERN, JobStatus
from async_inference.schemas import ErrorResponse, JobList, JobSubmission, JobView
from async_inference.service import ApiError, JobService
from lambdas.api import batch_routes
from lambdas.api.tenancy import tenant_of

logger = Logger()
tracer = Tracer()
metrics = Metrics()
app = APIGatewayRestResolver(enable_validation=True)
app.enable_swagger(path="/v1/docs", title="Async inference API", version="1")

config = ServiceSettings.load()
service = JobService.from_config(config.service, allow_local_webhooks=config.allow_local_webhooks,
                                 served_models=config.served_models)
batch_routes.configure(config)
app.include_router(batch_routes.router)

JobId = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="A job id as returned by POST /v1/jobs.")]
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
MAX_IDEMPOTENCY_KEY_CHARS = 255
FORM_OVERHEAD_BYTES = 16 * 1024  # a multipart body's boundaries and part headers around the file


# What each error status means here; every one carries ErrorResponse. Routes list the ones they can answer, so the
# OpenAPI document says exactly what a client will see.
_ERRORS = {
    400: "Invalid request: `error.message` starts with the field to fix",
    404: "No such job for this tenant; on submit, a model this deployment does not serve (`model_not_found`)",
    409: "The job is already final",
    413: "Body over the inline limit: use an upload job",
    503: "The queue is unavailable: retry",
}


def _documented(*codes: int, **success: Any) -> dict[int, Any]:
    responses = {code: {"description": _ERRORS[code], "content": {"application/json": {"model": ErrorResponse}}}
                 for code in codes}
    responses.update({int(code.removeprefix("s")): value for code, value in success.items()})
    return responses


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
    responses=_documented(
        400, 404, 413, 503,
        s202={"description": "Queued", "content": {"application/json": {"model": JobView}}},
        s201={"description": "Awaiting its upload", "content": {"application/json": {"model": JobView}}},
    ),
)
@tracer.capture_method
def create_job(submission: Annotated[JobSubmission, Body()]) -> Response[JobView]:
    tenant = _tenant()
    idempotency_key = app.current_event.headers.get(IDEMPOTENCY_KEY_HEADER)
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise ApiError(400, "invalid_request", f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")
    submitted = service.submit(tenant, submission, idempotency_key)
    if submitted.created:
        metrics.add_metric(name=settings.METRIC_JOBS_SUBMITTED, unit=MetricUnit.Count, value=1)
    status = HTTPStatus.CREATED if submitted.upload else HTTPStatus.ACCEPTED
    return _json(status, service.view(submitted.job, upload=submitted.upload))


@app.get("/v1/jobs/<job_id>", summary="Get a job's status and result", responses=_documented(400, 404))
@tracer.capture_method
def get_job(job_id: JobId) -> Response[JobView]:
    return _json(HTTPStatus.OK, service.view(service.get(_tenant(), job_id)))


@app.get("/v1/jobs", summary="List your jobs, newest first", responses=_documented(400))
@tracer.capture_method
def list_jobs(
    status: Annotated[Optional[JobStatus], Query()] = None,
    limit: Annotated[int, Query(ge=1, le=settings.MAX_PAGE_SIZE)] = settings.DEFAULT_PAGE_SIZE,
    next: Annotated[Optional[str], Query(max_length=2048)] = None,
) -> Response[JobList]:
    jobs, token = service.list(_tenant(), status=status, limit=limit, next_token=next)
    return _json(HTTPStatus.OK, JobList(jobs=[service.view(j) for j in jobs], next=token))


@app.post("/v1/jobs/<job_id>/cancel", summary="Cancel a job that has not finished", responses=_documented(400, 404, 409))
@tracer.capture_method
def cancel_job(job_id: JobId) -> Response[JobView]:
    return _json(HTTPStatus.OK, service.view(service.cancel(_tenant(), job_id)))


@app.get("/v1/openapi.json", summary="This API's OpenAPI document", include_in_schema=False)
def openapi():  # no return annotation: Powertools would try to validate the document against it
    document = json.loads(app.get_openapi_json_schema(title="Async inference API", version="1"))
    # Powertools declares a 422 on every validated route; this API answers validation errors with a 400 carrying
    # ErrorResponse (declared per route above), so the 422 and its schemas would only mislead clients.
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    for unused in ("HTTPValidationError", "ValidationError"):
        document.get("components", {}).get("schemas", {}).pop(unused, None)
    return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=json.dumps(document))


# --- Errors: mapped to responses in one place -----------------------------------------------------------------------


@app.exception_handler(ApiError)
def _api_error(exc: ApiError) -> Response:
    if exc.status >= 500:
        logger.error("service unavailable", extra={"code": exc.code})
    return _error(exc.status, exc.code, exc.message, exc.details)


@app.exception_handler(RequestValidationError)
def _validation_error(exc: RequestValidationError) -> Response:
    details = []
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "header")]
        if error.get("type") == "json_invalid":
            return _error(400, "invalid_json", "the request body is not valid JSON: " + error.get("ctx", {}).get("error", ""))
        details.append({"field": ".".join(loc) or "(body)", "message": error.get("msg", "invalid")})
    first = details[0] if details else {"field": "(body)", "message": "invalid"}
    return _error(400, "invalid_request", f"{first['field']}: {first['message']}", details)


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
    """Refuse oversize bodies and bodies that are not UTF-8 text before anything parses them (a file upload, which
    is multipart and may be binary, has its own limit)."""
    body = event.get("body") or ""
    try:
        raw = base64.b64decode(body, validate=True) if event.get("isBase64Encoded") else body.encode()
    except binascii.Error:
        return _raw_error(400, "invalid_request", "the request body is not valid base64")
    if batch_routes.is_file_upload(event):
        if len(raw) > settings.MAX_FILE_INLINE_BYTES + FORM_OVERHEAD_BYTES:
            message = (f"the file is larger than the {settings.MAX_FILE_INLINE_BYTES} bytes POST /v1/files takes; use "
                       "POST /v1/files/uploads (a presigned PUT) for large files")
            return _raw_error(413, "payload_too_large", message)
        return handler(event, context)
    if len(raw) > settings.MAX_INLINE_REQUEST_BYTES:
        message = f"the body is larger than {settings.MAX_INLINE_REQUEST_BYTES} bytes; use an upload job for large requests"
        return _raw_error(413, "payload_too_large", message)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return _raw_error(400, "invalid_json", "the request body is not UTF-8 text; send a JSON object")
    return handler(event, context)


@logger.inject_lambda_context(correlation_id_path="requestContext.requestId")
@tracer.capture_lambda_handler
@metrics.log_metrics
@body_checks
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
