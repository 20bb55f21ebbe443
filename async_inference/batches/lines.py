"""A batch input line, as one pydantic model that the planner and the worker both parse with, and a batch line's id
(``batch_req_...``), derived the same way by the worker that runs a line and by the DLQ handler that ends a chunk no
worker could run, so a line has one id whoever wrote it."""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from async_inference.endpoints import LineRequest, parse_line_body
from async_inference.limits import LimitExceeded, RequestLimits, check_request, field_in
from async_inference.responses import to_chat_request
from async_inference.schemas import ChatCompletionRequest, CompletionRequest
from async_inference.schemas.responses import ResponseCreate


class BatchInputLine(BaseModel):
    """One line of a batch's input file in OpenAI's format: ``{"custom_id", "method": "POST", "url", "body"}``.

    The structure is what planning checks (a batch with a malformed line fails as a whole); the body stays a JSON
    object here, because a body the request schema refuses is not structural: ``request()`` validates it as the jobs
    API does, and the worker writes a refused body to the error file as that line's 400. The url must be the batch's
    endpoint when the validation context names it (``{"endpoint": ...}``, as the planner validates). Other keys are
    ignored, as OpenAI's line format has none."""

    model_config = ConfigDict(extra="ignore", strict=True)

    custom_id: Annotated[str, StringConstraints(min_length=1)]
    method: Literal["POST"]
    url: str
    body: dict[str, Any]

    @field_validator("url")
    @classmethod
    def _the_batch_endpoint(cls, value: str, info: ValidationInfo) -> str:
        endpoint = (info.context or {}).get("endpoint")
        if endpoint is not None and value != endpoint:
            raise ValueError(f"url must be {endpoint}, the batch's endpoint")
        return value

    def request(self, limits: RequestLimits | None = None) -> LineRequest:
        """The body as the request its url takes (a chat.completions or an embeddings request...); a ValidationError
        (the jobs API's) when the schema refuses it, or when a chat request is over ``limits`` (the bounds on its
        cost, async_inference.limits; None: the defaults), naming the field and the limit as the jobs API does."""
        request = parse_line_body(self.url, self.body)
        chat = _as_chat(request)
        if chat is not None and chat.stream:  # the routes stream; a line's answer is a line of the output file
            error = PydanticCustomError(
                "unsupported_parameter",
                "a batch line is answered once, in the batch's output file: omit stream (or send false)",
            )
            details = InitErrorDetails(type=error, loc=("stream",), input=True)
            raise ValidationError.from_exception_data(type(request).__name__, [details])
        if chat is not None:
            try:
                check_request(chat, limits or RequestLimits())
            except LimitExceeded as exc:
                error = PydanticCustomError("limit_exceeded", "{message}", {"message": exc.message})
                field = field_in(self.url, exc.field)
                details = InitErrorDetails(type=error, loc=tuple(field.split(".")), input=None)
                raise ValidationError.from_exception_data(type(request).__name__, [details]) from exc
        return request


def _as_chat(request: LineRequest) -> ChatCompletionRequest | None:
    """The chat request a line runs as (a completions line's, a responses line's), whose cost is bounded; None for
    an embeddings line."""
    if isinstance(request, ChatCompletionRequest):
        return request
    if isinstance(request, CompletionRequest):
        return request.to_chat()
    if isinstance(request, ResponseCreate):
        return to_chat_request(request)
    return None


def line_errors(exc: ValidationError) -> dict[str, Any]:
    """The fields of a line a ValidationError of BatchInputLine names (custom_id, method, url, body), each once, with
    the value the line had there (None when missing)."""
    fields: dict[str, Any] = {}
    for error in exc.errors(include_url=False):
        loc = error.get("loc", ())
        name = str(loc[0]) if loc else "(line)"
        if name not in fields:
            fields[name] = None if error["type"] == "missing" else error.get("input")
    return fields


def line_id(batch_id: str, custom_id: str) -> str:
    """A line's id: derived from the batch and custom_id, so a redelivered chunk reuses it."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}\n{custom_id}".encode()).hexdigest()[:32]
