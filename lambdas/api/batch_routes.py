"""The OpenAI-compatible routes of the ingestion API: ``/v1/models``, the Files API and the Batches API.

Their answers are the wire objects of ``async_inference.batches.models`` (openai-python's own field for field), so the
official SDK pointed at ``<API>/v1`` parses them unmodified. Errors leave as the API's ``{"error": {...}}`` envelope
(the handler maps ``ServiceError`` in one place), whose ``code`` and ``message`` the SDK reads.
"""

# No `from __future__ import annotations`: Powertools reads the route signatures at run time (see handler.py).
import base64
from http import HTTPStatus
from typing import Annotated, Any, Literal

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Path, Query

from async_inference import settings
from async_inference.aws import client
from async_inference.batches.models import (
    BATCH_ID_PATTERN,
    FILE_ID_PATTERN,
    Batch,
    BatchCreate,
    FileDeleted,
    FileObject,
    FileUpload,
    FileUploadRequest,
    Model,
    ModelList,
    Page,
)
from async_inference.batches.multipart import MultipartError, parse_file_form
from async_inference.batches.service import BatchService
from async_inference.capacity_state import CapacityState
from async_inference.config import ServiceSettings
from async_inference.jobs_service import ErrorKind, ServiceError
from lambdas.api.openapi_document import error_responses, ok
from lambdas.api.tenancy import tenant_of

router = Router()
batches: BatchService | None = None  # set once by configure(), with the handler's settings
capacity: CapacityState | None = None  # each model's GPU launch failures, for GET /v1/models


def configure(config: ServiceSettings) -> None:
    """Build the service over the resources the API function's settings name (read once, by the handler)."""
    global batches, capacity
    batches = BatchService.from_settings(config)
    capacity = CapacityState.from_routes(config.model_fleets, client("autoscaling"))


FileId = Annotated[str, Path(pattern=FILE_ID_PATTERN, description="A file id as returned by POST /v1/files.")]
BatchId = Annotated[str, Path(pattern=BATCH_ID_PATTERN, description="A batch id as returned by POST /v1/batches.")]
After = Annotated[str | None, Query(min_length=1, max_length=64, description="The last id of the previous page.")]
NO_MODEL = "`model_not_found`: this deployment does not serve that model (GET /v1/models lists them)"
NO_FILE = "`not_found`: no such file of yours"
NO_BATCH = "`not_found`: no such batch of yours"
FILES_ROUTE = "/v1/files"  # the one route whose body is multipart (binary): handler.body_checks lets it through


def _service() -> BatchService:
    if batches is None:  # no batch table in this deployment's settings
        raise ServiceError(
            ErrorKind.NOT_FOUND, "not_found", "this deployment has no batch table: the Files and Batches APIs are off"
        )
    return batches


def _json(model: Any, status: int = HTTPStatus.OK) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=model)


def _tenant() -> str:
    return tenant_of(router.current_event)


def _raw_body() -> bytes:
    event = router.current_event
    body = event.body or ""
    return base64.b64decode(body) if event.is_base64_encoded else body.encode("utf-8", "surrogateescape")


# --- Models ---------------------------------------------------------------------------------------------------------


@router.get(
    "/v1/models",
    summary="The models this deployment serves (OpenAI's list shape)",
    responses={200: ok("The served models", ModelList), **error_responses()},
)
def list_models() -> Response[ModelList]:
    _tenant()
    models = _service().models()
    return _json(capacity.annotate_list(models) if capacity else models)


@router.get(
    "/v1/models/<model_id>",
    summary="One served model",
    responses={200: ok("The model", Model), **error_responses(400, e404=NO_MODEL)},
)
def get_model(model_id: Annotated[str, Path(max_length=256)]) -> Response[Model]:
    _tenant()
    model = _service().model(model_id)
    return _json(capacity.annotate(model) if capacity else model)


# --- Files ----------------------------------------------------------------------------------------------------------


@router.post(
    FILES_ROUTE,
    summary="Upload a batch input file (multipart/form-data: file, purpose=batch)",
    responses={
        200: ok("The file", FileObject),
        **error_responses(
            400,
            e413=f"`payload_too_large`: over {settings.MAX_FILE_INLINE_BYTES} bytes; use POST /v1/files/uploads",
            e429="`quota_exceeded`: the file would take the tenant past `max_stored_bytes` (the message names the "
            "limit), or over its usage plan",
        ),
    },
)
def create_file() -> Response[FileObject]:
    tenant = _tenant()
    try:
        form = parse_file_form(router.current_event.headers.get("content-type"), _raw_body())
    except MultipartError as exc:
        raise ServiceError(ErrorKind.INVALID, "invalid_request", str(exc)) from exc
    return _json(_service().create_file(tenant, filename=form.filename, purpose=form.purpose, data=form.data))


@router.post(
    "/v1/files/uploads",
    summary="Create a file whose bytes you PUT to a presigned URL (files over 4 MiB)",
    responses={
        201: ok("The file, with its presigned upload", FileUpload),
        **error_responses(
            400,
            415,
            e429="`quota_exceeded`: the file would take the tenant past `max_stored_bytes` (the message names the "
            "limit), or over its usage plan",
        ),
    },
)
def create_file_upload(request: Annotated[FileUploadRequest, Body()]) -> Response[FileUpload]:
    return _json(_service().create_upload(_tenant(), request), HTTPStatus.CREATED)


@router.get(
    FILES_ROUTE,
    summary="Your files, newest first (OpenAI's after/limit pagination)",
    responses={200: ok("A page of files", Page[FileObject]), **error_responses(400)},
)
def list_files(
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=settings.DEFAULT_FILE_PAGE_SIZE)] = settings.DEFAULT_FILE_PAGE_SIZE,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> Response[Page[FileObject]]:
    page = _service().list_files(_tenant(), after=after, limit=limit, order=order, purpose=purpose)
    return _json(page)


@router.get(
    "/v1/files/<file_id>",
    summary="A file",
    responses={200: ok("The file", FileObject), **error_responses(400, e404=NO_FILE)},
)
def get_file(file_id: FileId) -> Response[FileObject]:
    return _json(_service().get_file(_tenant(), file_id).wire())


@router.get(
    "/v1/files/<file_id>/content",
    summary="A file's bytes: a redirect to a presigned GET",
    responses={
        302: {
            "description": "The presigned GET of the file's bytes, in Location",
            "headers": {"Location": {"schema": {"type": "string", "format": "uri"}}},
        },
        **error_responses(400, e404=NO_FILE, e409="`conflict`: the file's upload has not arrived"),
    },
)
def get_file_content(file_id: FileId):  # no return annotation: the answer is a redirect, not a model
    # A redirect, not the bytes: a Lambda answer holds at most 6 MB; the SDK follows redirects (and drops its
    # Authorization header when the redirect leaves this origin).
    url = _service().content_url(_tenant(), file_id)
    return Response(
        status_code=HTTPStatus.FOUND, headers={"Location": url}, content_type=content_types.TEXT_PLAIN, body=""
    )


@router.delete(
    "/v1/files/<file_id>",
    summary="Delete a file",
    responses={200: ok("The deleted file", FileDeleted), **error_responses(400, e404=NO_FILE)},
)
def delete_file(file_id: FileId) -> Response[FileDeleted]:
    return _json(_service().delete_file(_tenant(), file_id))


# --- Batches --------------------------------------------------------------------------------------------------------


@router.post(
    "/v1/batches",
    summary="Create a batch from an uploaded input file",
    responses={
        200: ok("The batch, validating", Batch),
        **error_responses(
            400,
            415,
            503,
            e404="`not_found`: no such input file of yours",
            e429="`quota_exceeded`: the tenant's batches in flight hold `max_batch_lines_in_flight` lines (the message "
            "names the limit), or over its usage plan",
        ),
    },
)
def create_batch(request: Annotated[BatchCreate, Body()]) -> Response[Batch]:
    return _json(_service().create_batch(_tenant(), request))


@router.get(
    "/v1/batches",
    summary="Your batches, newest first (OpenAI's after/limit pagination)",
    responses={200: ok("A page of batches", Page[Batch]), **error_responses(400)},
)
def list_batches(
    after: After = None,
    limit: Annotated[int, Query(ge=1, le=settings.MAX_BATCH_PAGE_SIZE)] = settings.DEFAULT_BATCH_PAGE_SIZE,
) -> Response[Page[Batch]]:
    return _json(_service().list_batches(_tenant(), after=after, limit=limit))


@router.get(
    "/v1/batches/<batch_id>",
    summary="A batch",
    responses={200: ok("The batch", Batch), **error_responses(400, e404=NO_BATCH)},
)
def get_batch(batch_id: BatchId) -> Response[Batch]:
    return _json(_service().get_batch(_tenant(), batch_id).wire())


@router.post(
    "/v1/batches/<batch_id>/cancel",
    summary="Cancel a batch: its running lines stop, finished ones are kept",
    responses={
        200: ok("The batch, cancelling", Batch),
        **error_responses(400, e404=NO_BATCH, e409="`conflict`: the batch is already final"),
    },
)
def cancel_batch(batch_id: BatchId) -> Response[Batch]:
    return _json(_service().cancel_batch(_tenant(), batch_id))


def is_file_upload(event: dict[str, Any]) -> bool:
    """Whether ``event`` is a POST /v1/files (multipart, up to settings.MAX_FILE_INLINE_BYTES of file)."""
    return event.get("httpMethod") == "POST" and event.get("resource", event.get("path")) == FILES_ROUTE
