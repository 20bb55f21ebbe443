"""The HTTP API contract: authentication, tenancy, validation, idempotency, listing. Over HTTP against moto server."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from async_inference import settings
from async_inference_client import ApiError
from tests.e2e.conftest import chat

pytestmark = pytest.mark.e2e
KEY_A = {"x-api-key": "tenant-a-key-0123456789"}


def post(stack, body, headers=KEY_A, **kwargs):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return requests.post(
        f"{stack.api_url}/v1/jobs", data=data, headers={"Content-Type": "application/json", **headers}, **kwargs
    )


def assert_error_envelope(status, headers, body, *, expected_status, code):
    """The one error shape of the API, exactly: {"error": {"code", "message", "details": [...]}} as JSON."""
    assert status == expected_status, body
    assert headers["Content-Type"].startswith("application/json")
    document = json.loads(body)
    assert list(document) == ["error"] and sorted(document["error"]) == ["code", "details", "message"], document
    assert document["error"]["code"] == code and document["error"]["message"]
    assert isinstance(document["error"]["details"], list)


def test_missing_or_unknown_api_key_is_401_in_the_error_envelope(stack):
    # The template's authorizer refuses both ("Unauthorized"), which API Gateway answers with its UNAUTHORIZED
    # response, 401, rendered by the template as {"error": {...}} (OpenAI answers a bad key with 401 too).
    for headers in ({}, {"x-api-key": "not-a-key-of-ours-000000"}):
        response = requests.get(f"{stack.api_url}/v1/jobs", headers=headers)
        assert_error_envelope(
            response.status_code, response.headers, response.content, expected_status=401, code="invalid_api_key"
        )


@pytest.mark.parametrize("headers", [KEY_A, {}], ids=["with-key", "without-key"])
def test_a_path_no_route_serves_is_404_in_the_error_envelope(stack, headers):
    response = requests.get(f"{stack.api_url}/v1/no-such-route", headers=headers)
    assert_error_envelope(
        response.status_code, response.headers, response.content, expected_status=404, code="not_found"
    )
    # API Gateway's own message ("Missing Authentication Token") would send a client looking for a key problem
    assert "no route" in response.json()["error"]["message"]


def test_a_body_over_the_gateway_limit_is_413_in_the_error_envelope(stack):
    # API Gateway refuses a payload over 10 MB before any function runs (REQUEST_TOO_LARGE)
    response = requests.post(
        f"{stack.api_url}/v1/jobs",
        data=b"x" * (10 * 1024 * 1024 + 1),
        headers={**KEY_A, "Content-Type": "application/json"},
    )
    assert_error_envelope(
        response.status_code, response.headers, response.content, expected_status=413, code="payload_too_large"
    )


@pytest.mark.parametrize(("response_type", "code"), [("THROTTLED", "throttled"), ("QUOTA_EXCEEDED", "quota_exceeded")])
def test_throttling_and_quota_answers_are_429_in_the_error_envelope(stack, response_type, code):
    # Usage plans are not enforced locally (README), so this asks the local gateway for the answer it gives when
    # they are: the template's gateway response for the type, as API Gateway renders it.
    from local_runtime.rest_api import GatewayError, RestApi

    [api_id] = stack.deployment.of_type("AWS::ApiGateway::RestApi")
    gateway = RestApi(stack.deployment, api_id, stack.functions)
    status, headers, body = gateway._gateway_response(GatewayError(response_type), "request-1")
    assert_error_envelope(status, headers, body, expected_status=429, code=code)


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
        ({"request": chat(top_logprobs=2)}, "request.top_logprobs"),
        ({"request": chat(max_tokens=10, max_completion_tokens=20)}, "request.max_completion_tokens"),
        (
            {
                "request": {
                    "model": "m",
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "text", "text": "x"},
                                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                            ],
                        }
                    ],
                }
            },
            "request.messages.0.content.1",
        ),
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


@pytest.mark.parametrize(
    "second",
    [
        {"request": chat("a different prompt")},
        {"upload": {"size_bytes": 100}},
        {"request": chat("only once"), "metadata": {"run": "2"}},
    ],
    ids=["other-prompt", "upload-instead", "other-metadata"],
)
def test_an_idempotency_key_reused_for_a_different_request_is_422_naming_the_key(stack, api, second):
    # GIVEN a job submitted with an Idempotency-Key
    key = f"reused-{uuid.uuid4()}"
    first = post(stack, {"request": chat("only once")}, headers={**KEY_A, "Idempotency-Key": key})
    assert first.status_code == 202, first.text
    # WHEN the same key comes with a different request (another prompt, an upload, other metadata)
    response = post(stack, second, headers={**KEY_A, "Idempotency-Key": key})
    # THEN it is a 422 that names the key, and the first job is untouched
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused" and key in error["message"]
    job = api.get(first.json()["job_id"])
    assert job.upload is None and job.metadata == {}
    api.cancel(job.job_id)


def test_an_idempotency_key_whose_first_request_is_still_in_progress_is_409(stack):
    # GIVEN a request with this key that has stored its body but not yet created its job (what a concurrent first
    # request looks like from a second one, between its two writes)
    from async_inference.aws import client
    from async_inference.jobs import new_job_id

    key = f"in-progress-{uuid.uuid4()}"
    first_body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "the first one"}]}).encode()
    client("s3").put_object(
        Bucket=stack.resources.config.bucket_name,
        Body=first_body,
        Key=settings.request_key("tenant-a", new_job_id("tenant-a", key)),
    )
    # WHEN a different request comes with the same key
    response = post(stack, {"request": chat("a second, different one")}, headers={**KEY_A, "Idempotency-Key": key})
    # THEN it is a 409 to retry later, and the first request's body is not overwritten
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "idempotency_key_in_progress"
    assert key in response.json()["error"]["message"]
    stored = (
        client("s3")
        .get_object(
            Bucket=stack.resources.config.bucket_name, Key=settings.request_key("tenant-a", new_job_id("tenant-a", key))
        )["Body"]
        .read()
    )
    assert stored == first_body


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


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml", "multipart/form-data; boundary=x"],
)
def test_a_body_that_is_not_json_is_415_naming_the_type_to_send(stack, content_type):
    # GIVEN a valid submission sent with a content type that is not JSON (curl -d sends form encoding by default)
    body = json.dumps({"request": chat()})
    # WHEN it is posted
    response = requests.post(
        f"{stack.api_url}/v1/jobs", data=body, headers={**KEY_A, "Content-Type": content_type}, timeout=10
    )
    # THEN it is a 415 in the error envelope that names the type it got and the one to send, never a 500
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert "application/json" in error["message"] and content_type.split(";")[0] in error["message"]


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "APPLICATION/JSON",
        "Application/Json; Charset=UTF-8",
        "application/json;charset=utf-8",
        "application/vnd.example+json",
        None,
    ],
)
def test_json_is_accepted_in_any_case_with_a_charset_or_as_a_json_suffix(stack, api, content_type):
    # GIVEN a valid submission with a JSON content type in any spelling (or none: JSON is assumed)
    headers = {**KEY_A} if content_type is None else {**KEY_A, "Content-Type": content_type}
    # WHEN it is posted
    response = requests.post(
        f"{stack.api_url}/v1/jobs", data=json.dumps({"request": chat()}), headers=headers, timeout=10
    )
    # THEN the job is accepted
    assert response.status_code == 202, response.text
    api.cancel(response.json()["job_id"])


def test_an_empty_body_declared_as_another_type_is_415_too(stack):
    response = requests.post(f"{stack.api_url}/v1/jobs", headers={**KEY_A, "Content-Type": "text/plain"}, timeout=10)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_json_in_a_charset_other_than_utf8_is_415(stack):
    response = requests.post(
        f"{stack.api_url}/v1/jobs",
        data=json.dumps({"request": chat()}).encode("utf-16"),
        headers={**KEY_A, "Content-Type": "application/json; charset=utf-16"},
        timeout=10,
    )
    assert response.status_code == 415, response.text
    assert "UTF-8" in response.json()["error"]["message"]
