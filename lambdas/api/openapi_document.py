"""The API's OpenAPI contract: what each route can answer, and the served document built from the routes.

Powertools generates the document from the routes and the pydantic models they validate with. What it cannot know
is added here, in one place: the API key (the authorizer checks it before any function runs), the errors API Gateway
itself answers on every route (401, 403, 413, 429, in the same envelope: the template's gateway responses), and the
removal of what Powertools declares that this API never answers (its 422 validation error and the schemas behind
it; this API answers validation errors with a 400).
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn, HTTPBearer

from async_inference import settings
from async_inference.jobs import JOB_ID_PATTERN
from async_inference.schemas import ErrorResponse

API_KEY_HEADER = "x-api-key"
SECURITY_SCHEME = "apiKey"
BEARER_SCHEME = "bearer"
SECURITY_SCHEMES = {
    SECURITY_SCHEME: APIKey(
        name=API_KEY_HEADER,
        in_=APIKeyIn.header,
        description="Your tenant's API key. Missing or unknown: 401 `invalid_api_key`, answered by API Gateway.",
    ),
    # The same key as 'Authorization: Bearer <key>', which the OpenAI SDK sends (lambdas/authorizer reads either).
    BEARER_SCHEME: HTTPBearer(description="Your tenant's API key as a bearer token (the OpenAI SDK's api_key)."),
}
SECURITY = [{SECURITY_SCHEME: []}, {BEARER_SCHEME: []}]  # either one

# What each error status means; every one carries ErrorResponse. A route's own meaning (409) is given where it is
# declared.
ERRORS = {
    400: "Invalid request: `error.message` starts with the field to fix",
    401: "`invalid_api_key`: no API key was sent, or it is not a key of this API (the authorizer, through API Gateway)",
    403: "`forbidden`: the key is refused (disabled, or it belongs to no tenant)",
    404: "No such job for this tenant",
    410: f"`result_expired`: the job's result is deleted once the bucket's retention (default "
    f"{settings.PAYLOAD_RETENTION_DAYS} days) is over",
    413: "`payload_too_large`: a body over API Gateway's 10 MB payload limit",
    415: "`unsupported_media_type`: the body is not JSON; send Content-Type: application/json",
    422: "`idempotency_key_reused`: this Idempotency-Key was used for a different request",
    429: "`throttled` or `quota_exceeded`: over the tenant's usage plan rate or daily quota (API Gateway)",
    503: "`unavailable`: a queue the service writes to is unavailable; retry",
}
# Answered by API Gateway whatever the route.
GATEWAY_ERRORS = (401, 403, 413, 429)
RETRY_AFTER = {
    "Retry-After": {
        "description": "While the job is unfinished: seconds to wait before the next GET (a fifth of its time in its "
        f"state, 1 to {settings.MAX_POLL_AFTER_S})",
        "schema": {"type": "integer", "minimum": 1, "maximum": settings.MAX_POLL_AFTER_S},
    }
}

# The header that names the job behind an answer of a held route (lambdas/api/openai_routes.py) or of POST /v1/jobs.
JOB_ID_HEADER = "x-async-inference-job-id"
JOB_ID = {
    JOB_ID_HEADER: {
        "description": "The job that answered the request: GET /v1/jobs/{id} reads it, also after a 504",
        "schema": {"type": "string", "pattern": JOB_ID_PATTERN},
    }
}


def ok(description: str, model: Any, **extra: Any) -> dict[str, Any]:
    """The OpenAPI response of a success status whose body is ``model``."""
    return {"description": description, "content": {"application/json": {"model": model}}, **extra}


def error_responses(*codes: int, **descriptions: str) -> dict[int, Any]:
    """The OpenAPI responses of these error statuses and of API Gateway's own; ``descriptions`` (``e409="..."``)
    give a status the meaning it has on this route."""
    described = {**ERRORS, **{int(name.removeprefix("e")): text for name, text in descriptions.items()}}
    return {
        code: {"description": described[code], "content": {"application/json": {"model": ErrorResponse}}}
        for code in sorted({*codes, *GATEWAY_ERRORS, *(int(n.removeprefix("e")) for n in descriptions)})
    }


def served(document_json: str) -> dict[str, Any]:
    """The generated document as it is served: Powertools' undeclared 422s and every schema nothing refers to
    removed, so that no ``$ref`` dangles."""
    document = json.loads(document_json)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if "HTTPValidationError" in json.dumps(responses.get("422", {})):
                del responses["422"]
    schemas = document.get("components", {}).get("schemas", {})
    used = _referenced(document.get("paths", {}), schemas)
    for name in [name for name in schemas if name not in used]:
        del schemas[name]
    return document


def _referenced(root: Any, schemas: dict[str, Any]) -> set[str]:
    """The component schemas ``root`` refers to, directly or through other schemas."""
    prefix = "#/components/schemas/"
    found: set[str] = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(prefix) and ref[len(prefix) :] not in found:
                found.add(ref[len(prefix) :])
                pending.append(schemas.get(ref[len(prefix) :], {}))
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found
