"""OpenAI's Responses API in background mode: ``/v1/responses`` and its retrieve, cancel, delete and input items.

Each response is a job (``async_inference.response_service``); the answers are openai-python's Response objects
(``async_inference.responses``), so the official SDK's ``client.responses`` parses them unmodified. Errors leave as
the API's ``{"error": {...}}`` envelope, mapped in one place by the handler.
"""

# No `from __future__ import annotations`: Powertools reads the route signatures at run time (see handler.py).
from typing import Annotated, Literal

from aws_lambda_powertools.event_handler import Response as HttpResponse
from aws_lambda_powertools.event_handler import content_types
from aws_lambda_powertools.event_handler.api_gateway import Router
from aws_lambda_powertools.event_handler.openapi.params import Body, Header, Path, Query

from async_inference.jobs_service import JobApi
from async_inference.response_service import ResponseService
from async_inference.responses import RESPONSE_ID_PATTERN
from async_inference.schemas.responses import InputItemList, Response, ResponseCreate, ResponseDeleted
from lambdas.api import openai_routes
from lambdas.api.openapi_document import error_responses, ok
from lambdas.api.tenancy import tenant_of

router = Router()
responses: ResponseService | None = None  # set once by configure(), over the handler's JobApi
CREATE_ROUTE = "/v1/responses"  # a route with a JSON body: handler.body_checks sizes and types it

ResponseId = Annotated[
    str, Path(pattern=RESPONSE_ID_PATTERN, description="A response id as POST /v1/responses returned it.")
]
NO_RESPONSE = "`not_found`: no such response of yours"


def configure(jobs: JobApi) -> None:
    global responses
    responses = ResponseService(jobs)


def _service() -> ResponseService:
    assert responses is not None, "response_routes.configure() was not called"
    return responses


def _json(model: object) -> HttpResponse:
    return HttpResponse(status_code=200, content_type=content_types.APPLICATION_JSON, body=model)


def _tenant() -> str:
    return tenant_of(router.current_event)


@router.post(
    CREATE_ROUTE,
    summary="Create a response (OpenAI's Responses API), background or held until it ends",
    description="The response runs as a job. With `background: true` it is answered at once, `queued`; poll GET "
    "/v1/responses/{id} until its status is final. Without it the connection is held until the job ends and the "
    "answer is the final Response (docs/openai-routes.md: the maximum wait, the job id header). With `stream: true` "
    "the answer is the response's events as it decodes (docs/streaming.md). "
    "`previous_response_id` continues a stored response of the tenant's (404 `previous_response_not_found` for an "
    "unknown, deleted or another tenant's id; 400 for one not completed); `truncation: auto` drops the oldest turns "
    "that cannot fit the context. `conversation`, hosted tools and other parameters this service cannot honour are "
    "400s that name them (docs/design/responses.md).",
    responses={
        200: ok("The response: queued (background), else final", Response),
        **error_responses(
            400,
            415,
            422,
            503,
            e404="`model_not_found`: this deployment does not serve that model (GET /v1/models lists them); "
            "`previous_response_not_found`: no such response of yours to continue",
            e409="`idempotency_key_in_progress`: a request with this Idempotency-Key is still being processed",
            e429="`quota_exceeded`: the tenant has `max_active_jobs` unfinished jobs, or is over its usage plan",
            e500="`server_error`: a held response's job failed for a reason that is not the request's",
            e504="`job_still_running`: a held response did not end within the maximum wait; it goes on",
        ),
    },
)
def create_response(
    request: Annotated[ResponseCreate, Body()],
    idempotency_key: Annotated[str | None, Header(alias="idempotency-key", min_length=1, max_length=255)] = None,
):  # no return annotation (Powertools would validate against it): a held response's error is the error envelope
    if request.background is not True or request.stream:
        return openai_routes.answer_response(request, idempotency_key)  # held until its job ends, or streamed
    return _json(_service().create(_tenant(), request, idempotency_key))


@router.get(
    "/v1/responses/<response_id>",
    summary="A response: its status and, once final, its output; with stream=true its events (a resumed stream)",
    description="`stream=true` answers the response's events as `POST /v1/responses` with `stream: true` does, from "
    "the job's event log, on any API instance: after `starting_after`, the `sequence_number` of the last event the "
    "client received, it continues with the next one.",
    responses={200: ok("The response", Response), **error_responses(400, 410, e404=NO_RESPONSE)},
)
def get_response(
    response_id: ResponseId,
    stream: Annotated[bool, Query()] = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
):  # no return annotation: a streamed answer is text/event-stream, which Powertools would validate as a Response
    if stream:
        return openai_routes.resume_response(response_id, starting_after)
    return _json(_service().retrieve(_tenant(), response_id))


@router.post(
    "/v1/responses/<response_id>/cancel",
    summary="Cancel a queued or running background response",
    responses={
        200: ok("The response, cancelled", Response),
        **error_responses(400, e404=NO_RESPONSE, e409="`conflict`: the response already ended (completed, failed)"),
    },
)
def cancel_response(response_id: ResponseId) -> HttpResponse[Response]:
    return _json(_service().cancel(_tenant(), response_id))


@router.delete(
    "/v1/responses/<response_id>",
    summary="Delete a response (an unfinished one is cancelled first)",
    responses={200: ok("The deleted response", ResponseDeleted), **error_responses(400, e404=NO_RESPONSE)},
)
def delete_response(response_id: ResponseId) -> HttpResponse[ResponseDeleted]:
    return _json(_service().delete(_tenant(), response_id))


@router.get(
    "/v1/responses/<response_id>/input_items",
    summary="The response's input items (OpenAI's cursor page)",
    responses={200: ok("A page of input items", InputItemList), **error_responses(400, e404=NO_RESPONSE)},
)
def list_input_items(
    response_id: ResponseId,
    after: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> HttpResponse[InputItemList]:
    return _json(_service().input_items(_tenant(), response_id, after=after, limit=limit, order=order))
