"""The core says what went wrong (``ErrorKind``); the API adapter alone says which HTTP status answers it
(lambdas/api/errors.py)."""

from async_inference.jobs_service import ErrorKind
from lambdas.api.errors import status_of


def test_every_kind_of_core_error_has_an_http_status():
    # GIVEN every kind of error the core raises WHEN the API maps each to a status
    statuses = {kind: status_of(kind) for kind in ErrorKind}
    # THEN each is an error status, and distinct kinds answer distinct statuses
    assert all(400 <= status < 600 for status in statuses.values())
    assert len(set(statuses.values())) == len(statuses)


def test_only_an_unavailable_dependency_is_a_server_error():
    # GIVEN the kinds of core error WHEN mapped THEN only an unavailable dependency is a 5xx (the one a client retries
    # as it is, and the one the event intake lets Lambda retry): every other kind is the caller's to fix
    assert {kind for kind in ErrorKind if status_of(kind) >= 500} == {ErrorKind.UNAVAILABLE}
