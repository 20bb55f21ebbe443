"""The HTTP status the API answers for each kind of core error (``async_inference.jobs_service.ErrorKind``): the core
says what went wrong, this adapter says how HTTP spells it."""

from __future__ import annotations

from http import HTTPStatus

from async_inference.jobs_service import ErrorKind

HTTP_STATUS: dict[ErrorKind, HTTPStatus] = {
    ErrorKind.INVALID: HTTPStatus.BAD_REQUEST,
    ErrorKind.FORBIDDEN: HTTPStatus.FORBIDDEN,
    ErrorKind.NOT_FOUND: HTTPStatus.NOT_FOUND,
    ErrorKind.CONFLICT: HTTPStatus.CONFLICT,
    ErrorKind.GONE: HTTPStatus.GONE,
    ErrorKind.TOO_LARGE: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ErrorKind.MISMATCH: HTTPStatus.UNPROCESSABLE_ENTITY,
    ErrorKind.QUOTA: HTTPStatus.TOO_MANY_REQUESTS,
    # The one kind a client retries as it is: OpenAI's SDKs (and ours) retry a 503.
    ErrorKind.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
}


def status_of(kind: ErrorKind) -> HTTPStatus:
    """The HTTP status of an error of ``kind``."""
    return HTTP_STATUS[kind]
