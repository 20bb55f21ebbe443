"""What every side of the job service shares: its error, the checks of a request's model and cost, and the reading
of a stored request body."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from pydantic import ValidationError

from async_inference import safe_json
from async_inference.fleets import CHAT, FleetRoute, route_of, wrong_kind_message
from async_inference.limits import LimitExceeded, RequestLimits, check_request, clip, field_in, limits_for
from async_inference.quotas import TenantQuota
from async_inference.schemas import (
    EMBEDDINGS_ENDPOINT,
    ChatCompletion,
    ChatCompletionRequest,
    EmbeddingList,
    EmbeddingRequest,
    error_location,
    error_message,
)
from async_inference.served_models import ServedModels

JobResult = ChatCompletion | EmbeddingList  # a job's result object: a chat.completion, or an embeddings job's list


class NotAClaimCheck(ValueError):
    """A dead-lettered message that is not a claim check: there is no job to fail; it is left for an operator."""


class ErrorKind(Enum):
    """What went wrong, as the core knows it; the API adapter maps each kind to its HTTP status
    (lambdas/api/errors.py), the other callers decide by it (retry, refuse, wrap)."""

    INVALID = "invalid"  # the request is wrong: the message names the field to fix
    FORBIDDEN = "forbidden"  # the caller may not make it
    NOT_FOUND = "not_found"  # no such thing of the caller's (an unknown id and another tenant's alike)
    CONFLICT = "conflict"  # the thing's state forbids it now (already final, still in progress)
    GONE = "gone"  # it existed, and its data has expired
    TOO_LARGE = "too_large"  # over a size limit
    MISMATCH = "mismatch"  # a retry (same Idempotency-Key) that is not the request it retries
    QUOTA = "quota"  # over the tenant's quota
    UNAVAILABLE = "unavailable"  # a dependency failed: the request may be retried as it is


class ServiceError(Exception):
    """An error the client can fix or must know about: its ``kind``, a stable ``code`` and a message that says what to
    do; the API turns it into a JSON 4xx/5xx."""

    def __init__(self, kind: ErrorKind, code: str, message: str, details: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.message = message
        self.details = details or []


def describe_validation_error(exc: ValidationError, prefix: str = "") -> tuple[str, list[dict[str, str]]]:
    """A one-line message naming the first bad field, and one detail per error."""
    details = []
    for error in exc.errors(include_url=False):
        loc = clip(error_location(error), 200)  # a field's name is the caller's: a 1 MB one is quoted by its start
        field = ".".join(filter(None, [prefix, loc if loc != "(body)" else ""]))
        details.append({"field": field or "(body)", "message": error_message(error)})
    first = details[0] if details else {"field": "(body)", "message": "invalid"}
    return f"{first['field']}: {first['message']}", details


class ModelChecks:
    """Whether a request may run here: its model served by a fleet of its kind, its cost within the tenant's bounds."""

    def __init__(
        self,
        *,
        served: ServedModels | None = None,
        fleets: Mapping[str, FleetRoute] | None = None,
        limits: RequestLimits | None = None,
        quotas: Mapping[str, TenantQuota] | None = None,
    ) -> None:
        self.served = served or ServedModels.of(None)
        # Each model's queues and service (async_inference.fleets), the only way to a queue: a model without a route
        # is not served.
        self.fleets = dict(fleets or {})
        # The deployment's bounds on one request's cost; a tenant's plan may change them (async_inference.limits).
        self.limits = limits or RequestLimits()
        # None: no quotas; a tenant missing from it gets the defaults.
        self.quotas = quotas

    def check_model(self, model: str, *, field: str = "model", kind: str = CHAT) -> None:
        """404 model_not_found for a model this deployment does not serve, as vLLM and OpenAI answer; 400
        model_kind_mismatch for a model of another kind (a chat request for an embedding model) naming its endpoint."""
        problem = self.model_problem(model, kind)
        if problem is not None:
            error_kind, code, message = problem
            raise ServiceError(error_kind, code, message, [{"field": field, "message": message}])

    def model_problem(self, model: str, kind: str = CHAT) -> tuple[ErrorKind, str, str] | None:
        """Why a request of ``kind`` cannot run on ``model`` (error kind, code, message), or None when it can. The
        ``ANY_MODEL`` route takes a model of either kind."""
        if not self.served.serves(model) or route_of(self.fleets, model) is None:
            return ErrorKind.NOT_FOUND, "model_not_found", self.served.not_found_message(model)
        route = self.fleets.get(model)
        if route is not None and route.kind != kind:
            return ErrorKind.INVALID, "model_kind_mismatch", wrong_kind_message(model, route.kind, kind)
        return None

    def limits_of(self, tenant: str) -> RequestLimits:
        """The bounds on the cost of ``tenant``'s requests: the deployment's, with its plan's overrides."""
        quota = (self.quotas or {}).get(tenant)
        return limits_for(self.limits, quota.request_limits if quota is not None else None)

    def check_limits(self, tenant: str, request: object, *, prefix: str = "", endpoint: str | None = None) -> None:
        """400 limit_exceeded (context_length_exceeded for the model's context), naming the field and the limit, for a
        chat request over one of the tenant's bounds on a request's cost (async_inference.limits); other requests
        (embeddings) are not bounded here. ``endpoint``: the one the request was converted from (``/v1/responses``),
        whose field names the error uses."""
        if not isinstance(request, ChatCompletionRequest):
            return
        try:
            check_request(request, self.limits_of(tenant))
        except LimitExceeded as exc:
            field = prefix + field_in(endpoint, exc.field)
            # A prompt that cannot fit is OpenAI's context_length_exceeded, which clients know as their own error.
            code = "context_length_exceeded" if exc.limit == "context_tokens" else "limit_exceeded"
            raise ServiceError(
                ErrorKind.INVALID, code, f"{field}: {exc.message}", [{"field": field, "message": exc.message}]
            ) from exc


def parse_request_body(
    body: bytes, endpoint: str | None = None
) -> tuple[ChatCompletionRequest | EmbeddingRequest | None, str]:
    """A stored request body as the request of ``endpoint`` (None: chat.completions; an embeddings job's
    ``/v1/embeddings``), or None and why it is not one (for a failed job's reason)."""
    try:
        safe_json.loads(body)  # the limits every entry point holds input to, with their message
    except safe_json.UnsafeJson as exc:
        return None, "the body is not valid JSON" if exc.msg.startswith("not valid") else f"the body is refused: {exc}"
    model: type[ChatCompletionRequest | EmbeddingRequest] = ChatCompletionRequest
    name = "chat.completions"
    if endpoint == EMBEDDINGS_ENDPOINT:
        model, name = EmbeddingRequest, "embeddings"
    try:
        return model.model_validate_json(body), ""
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            return None, "the body is not valid JSON"
        message, _ = describe_validation_error(exc)
        return None, f"the body is not a valid {name} request: {message}"
