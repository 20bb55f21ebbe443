"""The HTTP API contract: authentication, tenancy, validation, idempotency, listing. Over HTTP against moto server."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from async_inference import settings
from async_inference.client import ApiError
from tests.e2e.conftest import chat

pytestmark = pytest.mark.e2e
KEY_A = {"x-api-key": "tenant-a-key-0123456789"}


def post(stack, body, headers=KEY_A, **kwargs):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(f"{stack.api_url}/v1/jobs", data=data, headers={"Content-Type": "application/json", **headers}, **kwargs)


def test_missing_or_unknown_api_key_is_401_in_the_error_envelope(stack):
    # The template's authorizer refuses both ("Unauthorized"), which API Gateway answers with its UNAUTHORIZED
    # response, 401, rendered by the template as {"error": {...}} (OpenAI answers a bad key with 401 too).
    for headers in ({}, {"x-api-key": "not-a-key-of-ours-000000"}):
        response = requests.get(f"{stack.api_url}/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", None),
        ({"request": chat(), "surprise": 1}, "surprise"),
        ({"request": {**chat(), "temprature": 0.2}}, "request.temprature"),
        ({"request": {"model": "m"}}, "request.messages"),
        ({"request": {"model": "m", "messages": []}}, "request.messages"),
        ({"request": chat(max_tokens=settings.MAX_TOKENS_LIMIT + 1)}, "request.max_tokens"),
        ({"request": chat(max_tokens=0)}, "request.max_tokens"),
        ({"request": chat(max_tokens="12")}, "request.max_tokens"),
        ({"request": chat(temperature="hot")}, "request.temperature"),
        ({"request": {"model": "m", "messages": [{"role": "robot", "content": "x"}]}}, "request.messages.0.role"),
        ({"request": chat(stop=["a", "b", "c", "d", "e"])}, "request.stop"),
        ({"request": chat(), "upload": {"size_bytes": 10}}, "(body)"),
        ({}, "(body)"),
        ({"upload": {"size_bytes": settings.MAX_UPLOAD_BYTES + 1}}, "upload.size_bytes"),
        ({"request": chat(), "metadata": {"k": 5}}, "metadata.k"),
        ([1, 2], None),
    ],
)
def test_bad_input_is_a_400_that_names_the_field(stack, body, field):
    # WHEN a client sends a malformed or invalid body
    response = post(stack, body)
    # THEN it gets a 400 whose message says which field and what is wrong, never a 5xx or a stack trace
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"]
    assert "Traceback" not in response.text
    if field is not None:
        assert error["message"].startswith(field), error


def test_body_over_the_inline_limit_is_413(stack):
    big = chat("x" * (settings.MAX_INLINE_REQUEST_BYTES + 1))
    response = post(stack, big)
    assert response.status_code == 413
    assert "upload" in response.json()["error"]["message"]


def test_malformed_job_id_is_400_and_unknown_job_is_404(stack):
    assert requests.get(f"{stack.api_url}/v1/jobs/../../etc", headers=KEY_A).status_code in (400, 404)
    assert requests.get(f"{stack.api_url}/v1/jobs/not-a-job", headers=KEY_A).status_code == 400
    response = requests.get(f"{stack.api_url}/v1/jobs/job_{uuid.uuid4().hex}", headers=KEY_A)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_other_tenants_jobs_are_invisible(api, other_api):
    # GIVEN a job of tenant A
    job = api.submit(chat("tenant a only"))
    # WHEN tenant B reads, cancels or lists it
    # THEN it is 404, exactly as for a job that does not exist, and absent from B's list
    for call in (lambda: other_api.get(job.job_id), lambda: other_api.cancel(job.job_id)):
        with pytest.raises(ApiError) as denied:
            call()
        assert denied.value.status == 404
    assert job.job_id not in [j.job_id for j in other_api.list(limit=100).jobs]
    assert api.get(job.job_id).status in ("queued", "running", "succeeded")
    api.cancel(job.job_id)


def test_idempotency_key_returns_the_same_job_for_a_retried_post(api):
    key = f"retry-{uuid.uuid4()}"
    first = api.submit(chat("only once"), idempotency_key=key)
    second = api.submit(chat("only once"), idempotency_key=key)
    assert second.job_id == first.job_id
    # A different key is a different job.
    assert api.submit(chat("only once"), idempotency_key=key + "-2").job_id != first.job_id
    api.cancel(first.job_id)


def test_list_is_newest_first_paginated_and_filters_by_status(other_api):
    # GIVEN three jobs of tenant B, one of them cancelled
    ids = [other_api.submit(chat(f"list {i}")).job_id for i in range(3)]
    other_api.cancel(ids[1])
    # WHEN listing two per page
    first = other_api.list(limit=2)
    second = other_api.list(limit=2, next_token=first.next)
    seen = [j.job_id for j in first.jobs + second.jobs]
    # THEN newest first across pages
    assert seen[:3] == ids[::-1]
    # AND the status filter returns only matching jobs
    cancelled = other_api.list(status="cancelled", limit=100).jobs
    assert ids[1] in [j.job_id for j in cancelled] and all(j.status == "cancelled" for j in cancelled)
    for job_id in (ids[0], ids[2]):
        other_api.cancel(job_id)


def test_list_rejects_bad_parameters(stack):
    for query in ("limit=0", f"limit={settings.MAX_PAGE_SIZE + 1}", "status=done", "next=garbage"):
        response = requests.get(f"{stack.api_url}/v1/jobs?{query}", headers=KEY_A)
        assert response.status_code == 400, (query, response.text)


def test_openapi_document_describes_the_routes_and_the_request_schema(stack):
    document = requests.get(f"{stack.api_url}/v1/openapi.json", headers=KEY_A).json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel"} <= set(document["paths"])
    assert "ChatCompletionRequest" in document["components"]["schemas"]
