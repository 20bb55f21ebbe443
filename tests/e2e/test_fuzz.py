"""The OpenAPI document the API serves, checked as a document and by property-based fuzzing on the local stack.

The document: valid OpenAPI 3.1 (openapi-spec-validator), no dangling ``$ref``, the API key declared as its security
scheme, every status each route can answer (its own and API Gateway's) documented with its body.

The fuzz: Schemathesis generates valid and invalid requests for every operation in ``/v1/openapi.json`` and
authenticates them from the document's security scheme (the key is declared to it, not added by hand). Properties:
no response is a 5xx; every response status is documented; every response matches the document (status, content type,
body schema); every error is the one JSON error envelope with a message and no stack trace.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate as validate_openapi
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from async_inference.aws import client
from async_inference.schemas import ErrorResponse
from local_runtime.stack import LocalDeployment

pytestmark = pytest.mark.e2e
FUZZ_KEY = {"x-api-key": "tenant-b-key-0123456789"}
# What Schemathesis authenticates with: the document's security scheme named, the key given to it.
FUZZ_AUTH = {"auth": {"openapi": {"apiKey": {"api_key": FUZZ_KEY["x-api-key"]}}}}
MAX_EXAMPLES = 20  # per operation and mode: eight runs, about 20 s on two cores


@pytest.fixture(scope="module")
def fuzzed_stack(stack: LocalDeployment) -> Iterator[LocalDeployment]:
    # A worker answers the routes that hold a request until its job ends (lambdas/api/openai_routes.py): without one
    # each valid example would wait out the maximum wait and end as a 504.
    worker = stack.start_worker()
    yield stack
    stack.stop_worker(worker)
    # The fuzzer submits valid jobs too: take their claim checks off the shared queue so that later tests' workers
    # do not spend time on them (PurgeQueue, once: nothing else runs while this module ends).
    assert stack.resources is not None
    client("sqs").purge_queue(QueueUrl=stack.resources.config.queue_url)


@pytest.fixture(scope="module")
def document(fuzzed_stack: LocalDeployment) -> dict[str, Any]:
    return requests.get(f"{fuzzed_stack.api_url}/v1/openapi.json", headers=FUZZ_KEY, timeout=10).json()


@pytest.fixture(scope="module")
def api_schema(fuzzed_stack: LocalDeployment, document: dict[str, Any]) -> Any:
    schema = schemathesis.openapi.from_dict(document, config=SchemathesisConfig.from_dict(FUZZ_AUTH))
    schema.config.update(base_url=fuzzed_stack.api_url)
    return schema


OPERATIONS = [
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("POST", "/v1/jobs/{job_id}/cancel"),
]
# The OpenAI-compatible routes (lambdas/api/batch_routes.py); POST /v1/files is multipart, which the document does not
# describe as a schema, so tests/e2e/test_batches_openai.py drives it instead.
OPENAI_OPERATIONS = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/files"),
    ("POST", "/v1/files/uploads"),
    ("GET", "/v1/files/{file_id}"),
    ("DELETE", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
]
# OpenAI's Responses API in background mode (lambdas/api/response_routes.py).
RESPONSES_OPERATIONS = [
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/responses/{response_id}/cancel"),
    ("GET", "/v1/responses/{response_id}/input_items"),
]
HELD_OPERATIONS = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/embeddings")]
PARAMETERLESS = {("GET", "/v1/models")}


def error_envelope(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx is {"error": {"code", "message", "details"}} with a message, and nothing leaks a trace."""
    assert "Traceback" not in response.text and 'File "' not in response.text
    if response.status_code >= 400:
        body = ErrorResponse.model_validate_json(response.content)
        assert body.error.message


def test_the_document_has_the_operations_fuzzed_here(api_schema: Any) -> None:
    expected = OPERATIONS + OPENAI_OPERATIONS + RESPONSES_OPERATIONS + HELD_OPERATIONS + [("POST", "/v1/files")]
    assert sorted((op.method.upper(), op.path) for op in _operations(api_schema)) == sorted(expected)


# --- The document ---------------------------------------------------------------------------------------------------


def test_the_document_is_valid_openapi_and_every_ref_resolves(document: dict[str, Any]) -> None:
    validate_openapi(document)  # raises on an invalid document, a dangling $ref included
    refs = {ref for ref in _refs(document)}
    assert refs, "the document refers to its component schemas"
    schemas = document["components"]["schemas"]
    assert {ref.removeprefix("#/components/schemas/") for ref in refs} <= set(schemas)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if isinstance(node.get("$ref"), str) else []) + [
            r for v in node.values() for r in _refs(v)
        ]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_the_api_key_is_the_documents_security_scheme(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    # The key as x-api-key or as a bearer token (what the OpenAI SDK sends): either one authenticates.
    assert schemes == {
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key", "description": ANY},
        "bearer": {"type": "http", "scheme": "bearer", "description": ANY},
    }
    assert document["security"] == [{"apiKey": []}, {"bearer": []}]


# Each route's own statuses; every route also documents API Gateway's 401 (no key or an unknown one), 403 (a refused
# key), 413 (10 MB) and 429 (usage plan).
DOCUMENTED = {
    ("POST", "/v1/jobs"): {"200", "201", "202", "400", "404", "409", "413", "415", "422", "503"},
    ("GET", "/v1/jobs"): {"200", "400"},
    ("GET", "/v1/jobs/{job_id}"): {"200", "400", "404", "410"},
    ("POST", "/v1/jobs/{job_id}/cancel"): {"200", "400", "404", "409"},
}


GATEWAY = {"401", "403", "413", "429"}


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_status_a_route_answers_is_documented_with_its_body(
    document: dict[str, Any], method: str, path: str
) -> None:
    responses = document["paths"][path][method.lower()]["responses"]
    assert set(responses) == DOCUMENTED[(method, path)] | GATEWAY
    success = "JobList" if (method, path) == ("GET", "/v1/jobs") else "JobView"
    for status, response in responses.items():
        [schema] = [content["schema"] for content in response["content"].values()]
        expected = "ErrorResponse" if int(status) >= 400 else success
        assert schema == {"$ref": f"#/components/schemas/{expected}"}, (status, schema)


# A request held until its job ends (lambdas/api/openai_routes.py) also answers how its job ended: 500 failed, 504 still
# running after the maximum wait.
HELD = {"200", "400", "404", "409", "415", "422", "500", "503", "504"}
OPENAI_DOCUMENTED = {
    ("GET", "/v1/models"): {"200"},
    ("GET", "/v1/models/{model_id}"): {"200", "400", "404"},
    ("POST", "/v1/files"): {"200", "400", "413"},
    ("POST", "/v1/files/uploads"): {"201", "400", "415"},
    ("GET", "/v1/files"): {"200", "400"},
    ("GET", "/v1/files/{file_id}"): {"200", "400", "404"},
    ("DELETE", "/v1/files/{file_id}"): {"200", "400", "404"},
    ("GET", "/v1/files/{file_id}/content"): {"302", "400", "404", "409"},
    ("POST", "/v1/batches"): {"200", "400", "404", "415", "503"},
    ("GET", "/v1/batches"): {"200", "400"},
    ("GET", "/v1/batches/{batch_id}"): {"200", "400", "404"},
    ("POST", "/v1/batches/{batch_id}/cancel"): {"200", "400", "404", "409"},
    ("POST", "/v1/responses"): {"200", "400", "404", "409", "415", "422", "500", "503", "504"},
    ("POST", "/v1/chat/completions"): HELD,
    ("POST", "/v1/completions"): HELD,
    ("POST", "/v1/embeddings"): HELD,
    ("GET", "/v1/responses/{response_id}"): {"200", "400", "404", "410"},
    ("DELETE", "/v1/responses/{response_id}"): {"200", "400", "404"},
    ("POST", "/v1/responses/{response_id}/cancel"): {"200", "400", "404", "409"},
    ("GET", "/v1/responses/{response_id}/input_items"): {"200", "400", "404"},
}


@pytest.mark.parametrize(("method", "path"), list(OPENAI_DOCUMENTED))
def test_every_status_an_openai_route_answers_is_documented(document: dict[str, Any], method: str, path: str) -> None:
    responses = document["paths"][path][method.lower()]["responses"]
    assert set(responses) == OPENAI_DOCUMENTED[(method, path)] | GATEWAY
    for status, response in responses.items():
        if int(status) >= 400:
            [schema] = [content["schema"] for content in response["content"].values()]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (status, schema)


def test_polling_a_job_documents_its_retry_after(document: dict[str, Any]) -> None:
    ok = document["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]["200"]
    assert ok["headers"]["Retry-After"]["schema"]["type"] == "integer"


def test_the_submission_is_one_of_an_inline_request_or_an_upload(document: dict[str, Any]) -> None:
    body = document["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    submission = document["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert submission["oneOf"] == [{"required": ["request"]}, {"required": ["upload"]}]
    assert submission["additionalProperties"] is False


def test_the_idempotency_key_is_a_documented_header(document: dict[str, Any]) -> None:
    headers = {
        p["name"].lower(): p for p in document["paths"]["/v1/jobs"]["post"].get("parameters", []) if p["in"] == "header"
    }
    assert set(headers) == {"idempotency-key", "prefer"}  # prefer: RFC 7240's wait=N (lambdas/api/openai_routes.py)
    assert headers["idempotency-key"]["required"] is False and headers["prefer"]["required"] is False


# --- The fuzz -------------------------------------------------------------------------------------------------------


def _operations(api_schema: Any) -> list[Any]:
    return [result.ok() for result in api_schema.get_all_operations()]


# Schemathesis' own pytest loader does not run under pytest 9 ('Function' has no '_nodeid'), so each operation's
# strategy is drawn from inside a plain Hypothesis test.
@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [
        pytest.param(
            method, path, mode, id=f"{method}-{path}-{'valid' if mode is GenerationMode.POSITIVE else 'invalid'}"
        )
        for method, path in OPERATIONS + OPENAI_OPERATIONS + RESPONSES_OPERATIONS + HELD_OPERATIONS
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if not (mode is GenerationMode.NEGATIVE and (method, path) in PARAMETERLESS)  # nothing there to make invalid
    ],
)
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_5xx_and_every_response_matches_the_document(
    api_schema: Any, method: str, path: str, mode: GenerationMode, data: Any
) -> None:
    case = data.draw(api_schema[path][method].as_strategy(generation_mode=mode))
    response = case.call()
    case.validate_response(
        response,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
        additional_checks=[error_envelope],
    )


def test_a_body_that_is_not_utf8_is_a_400(fuzzed_stack: LocalDeployment) -> None:
    response = requests.post(
        f"{fuzzed_stack.api_url}/v1/jobs",
        data=b"WW|\xd3\x83\xf6",
        headers={**FUZZ_KEY, "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 400, response.text


def test_an_idempotency_key_over_its_limit_is_a_400_naming_the_header(fuzzed_stack: LocalDeployment) -> None:
    response = requests.post(
        f"{fuzzed_stack.api_url}/v1/jobs",
        data=json.dumps({"upload": {"size_bytes": 10}}),
        headers={**FUZZ_KEY, "Content-Type": "application/json", "Idempotency-Key": "k" * 256},
        timeout=10,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"].startswith("idempotency-key")
