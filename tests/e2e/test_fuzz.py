"""Property-based fuzz of the HTTP API from the OpenAPI document it serves, on the local stack.

Schemathesis generates valid and invalid requests for every operation in ``/v1/openapi.json``. Properties: no
response is a 5xx; every response that the document describes matches it (status, content type, body schema); every
error, described or not, is the one JSON error envelope with a message and no stack trace.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import requests
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from async_inference.aws import client
from async_inference.schemas import ErrorResponse
from local_runtime.stack import LocalStack

pytestmark = pytest.mark.e2e
FUZZ_KEY = {"x-api-key": "tenant-b-key-0123456789"}
MAX_EXAMPLES = 20  # per operation and mode: eight runs, about 20 s on two cores


@pytest.fixture(scope="module")
def fuzzed_stack(stack: LocalStack) -> Iterator[LocalStack]:
    yield stack
    # The fuzzer submits valid jobs too: take their claim checks off the shared queue so that later tests' workers
    # do not spend time on them (PurgeQueue, once: nothing else runs while this module ends).
    assert stack.resources is not None
    client("sqs").purge_queue(QueueUrl=stack.resources.config.queue_url)


@pytest.fixture(scope="module")
def api_schema(fuzzed_stack: LocalStack) -> Any:
    document = requests.get(f"{fuzzed_stack.api_url}/v1/openapi.json", headers=FUZZ_KEY, timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=fuzzed_stack.api_url)
    return schema


OPERATIONS = [("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job_id}"), ("POST", "/v1/jobs/{job_id}/cancel")]
# The OpenAI-compatible routes (lambdas/api/batch_routes.py); POST /v1/files is multipart, which the document does not
# describe as a schema, so tests/e2e/test_batches_openai.py drives it instead.
OPENAI_OPERATIONS = [
    ("GET", "/v1/models"), ("GET", "/v1/models/{model_id}"), ("GET", "/v1/files"), ("POST", "/v1/files/uploads"),
    ("GET", "/v1/files/{file_id}"), ("DELETE", "/v1/files/{file_id}"), ("GET", "/v1/files/{file_id}/content"),
    ("POST", "/v1/batches"), ("GET", "/v1/batches"), ("GET", "/v1/batches/{batch_id}"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
]
PARAMETERLESS = {("GET", "/v1/models")}


def error_envelope(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx is {"error": {"code", "message", "details"}} with a message, and nothing leaks a trace."""
    assert "Traceback" not in response.text and 'File "' not in response.text
    if response.status_code >= 400:
        body = ErrorResponse.model_validate_json(response.content)
        assert body.error.message


def test_the_document_has_the_operations_fuzzed_here(api_schema: Any) -> None:
    expected = OPERATIONS + OPENAI_OPERATIONS + [("POST", "/v1/files")]
    assert sorted((op.method.upper(), op.path) for op in _operations(api_schema)) == sorted(expected)


def _operations(api_schema: Any) -> list[Any]:
    return [result.ok() for result in api_schema.get_all_operations()]


# Schemathesis' own pytest loader does not run under pytest 9 ('Function' has no '_nodeid'), so each operation's
# strategy is drawn from inside a plain Hypothesis test.
@pytest.mark.parametrize(("method", "path", "mode"), [
    pytest.param(method, path, mode, id=f"{method}-{path}-{'valid' if mode is GenerationMode.POSITIVE else 'invalid'}")
    for method, path in OPERATIONS + OPENAI_OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if not (mode is GenerationMode.NEGATIVE and (method, path) in PARAMETERLESS)  # nothing there to make invalid
])
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_no_5xx_and_every_response_matches_the_document(
    api_schema: Any, method: str, path: str, mode: GenerationMode, data: Any
) -> None:
    case = data.draw(api_schema[path][method].as_strategy(generation_mode=mode))
    response = case.call(headers=FUZZ_KEY)
    case.validate_response(
        response,
        checks=[not_a_server_error, content_type_conformance, response_schema_conformance],
        additional_checks=[error_envelope],
    )


def test_a_body_that_is_not_utf8_is_a_400(fuzzed_stack: LocalStack) -> None:
    response = requests.post(f"{fuzzed_stack.api_url}/v1/jobs", data=b"WW|\xd3\x83\xf6",
                             headers={**FUZZ_KEY, "Content-Type": "application/json"}, timeout=10)
    assert response.status_code == 400, response.text


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_every_status_code_is_documented(api_schema: Any, data: Any) -> None:
    case = data.draw(api_schema["/v1/jobs"]["POST"].as_strategy())
    response = case.call(headers=FUZZ_KEY)
    case.validate_response(response, checks=[status_code_conformance])
