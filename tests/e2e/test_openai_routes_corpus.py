"""The shared corpus of real OpenAI request bodies (tests/conformance/corpus, /work/shared/data/openai_requests) posted
as recorded, each to the route it was recorded on, against the local stack: the share of the bodies a text model can
answer that are accepted and answered with OpenAI's object. Each test prints its figures (``pytest -s``).

Which chat bodies a text model can answer is decided by the reference (tests/conformance/openai_reference.py), apart
from the service's schema; a streaming body is counted apart, as the object its stream made (``_streamed``). The
other endpoints have no reference: their figures are what was answered, and each refusal must be a 400 naming a field.

``make corpus-check`` runs the chat bodies on the CPU engine (the real SmolLM2-135M, ``CORPUS_ENGINE=cpu``) in place
of the echo engine, which refuses what it cannot imitate (``response_format``, forced tool calls): there every valid
body must be answered, and an answer whose JSON was asked for (``json_object``, ``json_schema``) must parse.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from async_inference_client import Client
from local_runtime.stack import API_FUNCTION_INSTANCES, LocalDeployment
from tests.conformance.openai_reference import CORPUS, MODEL_PLACEHOLDER, classify
from tests.e2e.conftest import EMBEDDING_MODEL, TENANT_KEYS
from tests.e2e.test_openai_routes import warm_up

pytestmark = pytest.mark.e2e
# The engine the chat bodies run on: "echo" in make test, "cpu" in make corpus-check (the real model, minutes).
CORPUS_ENGINE = os.environ.get("CORPUS_ENGINE", "echo")
# How long a job past its route's hold is waited for: a loaded 2-core machine decodes a corpus slowly.
FINISH_WAIT_S = 120 if CORPUS_ENGINE == "echo" else 1800
KEY_A = next(iter(TENANT_KEYS))
JOB_ID_HEADER = "x-async-inference-job-id"
OBJECTS = {
    "/v1/chat/completions": "chat.completion",
    "/v1/completions": "text_completion",
    "/v1/responses": "response",
    "/v1/embeddings": "list",
}


@pytest.fixture
def chat_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    """A worker on ``CORPUS_ENGINE``; a CPU one answers a first job before the corpus is posted (its model loads
    before it receives, longer than a held request waits)."""
    if CORPUS_ENGINE == "echo":
        process = stack.start_worker()
    else:
        process = stack.start_worker(ENGINE=CORPUS_ENGINE)
        with Client(stack.api_url, KEY_A) as api:
            job = api.submit({"model": "echo-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            assert api.wait(job.job_id, timeout_s=600).status == "succeeded"
    yield process
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def embedding_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ENGINE="cpu", MODEL_KIND="embedding")
    warm_up(stack)
    yield process
    stack.stop_worker(process)


def _bodies(endpoint: str, model: str) -> list[dict]:
    bodies = []
    for text in CORPUS.read_text().splitlines():
        record = json.loads(text)
        if record["endpoint"] == endpoint:
            body = dict(record["body"])
            if body.get("model") == MODEL_PLACEHOLDER:
                body["model"] = model
            bodies.append(body)
    return bodies


def _post_all(stack: LocalDeployment, endpoint: str, bodies: list[dict]) -> list[tuple[int, dict]]:
    """Each body posted as recorded, as many at once as the local API has function instances."""
    headers = {"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json"}

    def post(body: dict) -> tuple[int, dict]:
        answer = requests.post(stack.api_url + endpoint, data=json.dumps(body), headers=headers, timeout=60)
        if answer.status_code >= 500:
            print(f"\n{answer.status_code} for {json.dumps(body)[:300]}: {answer.text[:1000]}")
        error = answer.json().get("error", {}) if answer.status_code == 504 else {}
        if error.get("code") == "job_still_running":
            # accepted and still running past the route's hold (a loaded machine): the job goes on, and its result is
            # the answer the held request would have been
            return _finished(stack, endpoint, error["job_id"])
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            made = _streamed(endpoint, answer.text, answer.headers[JOB_ID_HEADER])
            # A stream's status is sent before the job runs; one that ended on the request's fault (its error's code
            # is the job's error code, not server_error) counts as the 400 its held request would have been.
            code = made.get("error", {}).get("code")
            return (400 if code not in (None, "server_error", "failed") else answer.status_code), made
        return answer.status_code, answer.json()

    with ThreadPoolExecutor(API_FUNCTION_INSTANCES) as pool:
        return list(pool.map(post, bodies))


def _finished(stack: LocalDeployment, endpoint: str, job_id: str) -> tuple[int, dict]:
    """A job that outlived its route's hold, waited for as the 504 says (GET /v1/jobs/{id}): its stored result, the
    object the held request would have answered, else its error as a held request's error names the job."""
    with Client(stack.api_url, KEY_A) as api:
        job = api.wait(job_id, timeout_s=FINISH_WAIT_S)
    if job.status == "succeeded" and job.result is not None:
        return 200, requests.get(job.result.url, timeout=30).json()
    return 400, {"error": {"code": "failed", "message": job.error or "", "job_id": job_id}}


def _streamed(endpoint: str, text: str, job_id: str) -> dict:
    """A streamed answer as what it made: ``{"object": ...}`` when the stream ended complete (``[DONE]``, or
    ``response.completed`` / ``response.incomplete``), else its error as a held request's error names the job."""
    events = [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: {")]
    errors = [e["error"] for e in events if "error" in e and "object" not in e and "type" not in e]
    errors += [e["response"]["error"] for e in events if e.get("type") == "response.failed"]
    if errors:
        message = errors[0]["message"].removeprefix("the job failed: ")
        return {"error": {"code": errors[0].get("code"), "message": message, "job_id": job_id}}
    complete = text.rstrip().endswith("data: [DONE]") or (
        events and events[-1].get("type") in ("response.completed", "response.incomplete")
    )
    return {"object": OBJECTS[endpoint]} if complete else {"error": {"code": "incomplete_stream", "message": text}}


def _tally(endpoint: str, answers: list[tuple[int, dict]]) -> tuple[int, Counter[str]]:
    """How many were answered with the endpoint's object, and the others by status, code and the field a 400 names,
    or, for a job that ran and failed, ``job:`` and the start of its reason."""
    answered, others = 0, Counter()
    for status, body in answers:
        if status == 200 and body.get("object") == OBJECTS[endpoint]:
            answered += 1
            continue
        error = body.get("error") or {}
        field = (error.get("details") or [{}])[0].get("field", "")
        if "job_id" in error:  # accepted as a job, which ended without a result
            field = "job: " + error["message"][:48]
        others[f"{status} {error.get('code')} {field}".strip()] += 1
    return answered, others


def _refused_by_name(others: Counter[str]) -> bool:
    """Whether each body not answered was refused with a 400 that names a field, or ran as a job the engine refused."""
    return all(key.startswith("400 ") and len(key.split()) >= 3 for key in others)


ECHO_LIMIT = "job: the echo engine cannot honour"  # what the echo engine refuses, the model-backed engines honour


def _json_asked_and_unparsed(bodies: list[dict], answers: list[tuple[int, dict]]) -> list[int]:
    """The indices of the answers that finished (``stop``) a body asking for JSON with content that does not parse."""
    unparsed = []
    for index, (body, (status, answer)) in enumerate(zip(bodies, answers, strict=True)):
        kind = (body.get("response_format") or {}).get("type")
        if status != 200 or kind not in ("json_object", "json_schema") or "choices" not in answer:
            continue
        for choice in answer["choices"]:
            if choice["finish_reason"] == "stop":
                try:
                    json.loads(choice["message"]["content"])
                except (TypeError, json.JSONDecodeError):
                    unparsed.append(index)
    return unparsed


def test_valid_chat_bodies_are_accepted_and_answered_on_the_chat_route(stack, chat_worker):
    # GIVEN the corpus's chat bodies that OpenAI takes and a text model can answer, and those that would be such
    # but stream
    bodies = _bodies("/v1/chat/completions", "echo-model")
    valid = [b for b in bodies if classify(b).kind == "valid" and b.get("stream") is not True]
    streaming = [b for b in bodies if b.get("stream") is True and classify(b).kind == "valid"]
    # WHEN each is posted to POST /v1/chat/completions as recorded
    started = time.monotonic()
    answers = _post_all(stack, "/v1/chat/completions", valid)
    answered, others = _tally("/v1/chat/completions", answers)
    streamed, stream_others = _tally("/v1/chat/completions", _post_all(stack, "/v1/chat/completions", streaming))
    echo_limits = sum(count for key, count in others.items() if ECHO_LIMIT in key)
    accepted = answered + sum(count for key, count in others.items() if " job: " in key)
    print(
        f"\nchat: of {len(valid)} valid bodies, {accepted} accepted ({accepted / len(valid):.1%}), {answered} answered "
        f"({answered / len(valid):.1%}), {echo_limits} refused by the echo engine (response_format, tool_choice); "
        f"not answered: {dict(others)}"
    )
    stream_limits = sum(count for key, count in stream_others.items() if ECHO_LIMIT in key)
    stream_accepted = streamed + sum(count for key, count in stream_others.items() if " job: " in key)
    print(
        f"chat, streaming: {streamed}/{len(streaming)} streamed whole, {stream_accepted} accepted, {stream_limits} "
        f"refused by the echo engine; not: {dict(stream_others)}; {CORPUS_ENGINE} engine, "
        f"{time.monotonic() - started:.0f} s"
    )
    if CORPUS_ENGINE != "echo":
        # THEN (a model-backed engine) every valid body is answered, whole when streamed, and asked-for JSON parses
        assert answered >= 0.95 * len(valid) and streamed >= 0.95 * len(streaming), (others, stream_others)
        assert _json_asked_and_unparsed(valid, answers) == []
        return
    # THEN at least 95% are accepted as jobs; each accepted one is answered (streamed whole, for a streaming one)
    # unless it asks what the echo engine cannot do
    assert accepted >= 0.95 * len(valid), others
    assert answered + echo_limits == accepted, others
    assert stream_accepted >= 0.95 * len(streaming), stream_others
    assert streamed + stream_limits == stream_accepted, stream_others


def _continuing_a_stored_response(stack: LocalDeployment, bodies: list[dict]) -> list[dict]:
    """The bodies, each ``previous_response_id`` (an id of OpenAI's) replaced by one of a response stored here."""
    headers = {"Authorization": f"Bearer {KEY_A}"}
    stored = requests.post(
        stack.api_url + "/v1/responses", json={"model": "echo-model", "input": "hello"}, headers=headers, timeout=60
    )
    assert stored.status_code == 200, stored.text
    return [{**b, "previous_response_id": stored.json()["id"]} if b.get("previous_response_id") else b for b in bodies]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/responses"])
def test_completions_and_responses_bodies_are_answered_or_refused_by_name(stack, worker, endpoint):
    # GIVEN the corpus's bodies of the endpoint, those that continue a response continuing one stored here
    bodies = _bodies(endpoint, "echo-model")
    if endpoint == "/v1/responses":
        bodies = _continuing_a_stored_response(stack, bodies)
    # WHEN each is posted to it as recorded
    answered, others = _tally(endpoint, _post_all(stack, endpoint, bodies))
    print(f"\n{endpoint}: {answered}/{len(bodies)} answered; not: {dict(others)}")
    # THEN each is answered with the endpoint's object, or refused with a 400 that names a field (or the echo engine's)
    assert _refused_by_name(others), others
    assert answered > 0


def test_embeddings_bodies_are_answered_or_refused_by_name(stack, embedding_worker):
    bodies = _bodies("/v1/embeddings", EMBEDDING_MODEL)
    answered, others = _tally("/v1/embeddings", _post_all(stack, "/v1/embeddings", bodies))
    print(f"\n/v1/embeddings: {answered}/{len(bodies)} answered; not: {dict(others)}")
    assert _refused_by_name(others), others
    assert answered > 0


def test_the_bodies_that_continue_a_response_are_answered_continuing_a_stored_one(stack, worker):
    # GIVEN the corpus's Responses bodies that continue a response (4), each continuing one stored here
    continuing = [b for b in _bodies("/v1/responses", "echo-model") if b.get("previous_response_id")]
    assert len(continuing) == 4
    # WHEN each is posted as recorded
    answered, others = _tally(
        "/v1/responses", _post_all(stack, "/v1/responses", _continuing_a_stored_response(stack, continuing))
    )
    print(f"\ncontinuing a response: {answered}/{len(continuing)} answered; not: {dict(others)}")
    # THEN none is refused for previous_response_id; those that ask nothing else refused (the two SDK-test bodies
    # also send conversation, stream_options...) are answered
    assert answered >= 2 and not any("previous_response_id" in key for key in others), others
