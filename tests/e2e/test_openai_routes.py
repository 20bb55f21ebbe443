"""OpenAI's own routes end to end: the official ``openai`` SDK (sync and async) and LangChain, unmodified, pointed at
the local stack with only a base URL and a key, each request a job held until it ends (lambdas/api/openai_routes.py).

No worker runs unless a test starts one: the echo worker (``worker``) for chat, completions and responses; the CPU
embedding worker (``embedding_worker``) for embeddings, alone, since both would take jobs from the same queue here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator

import openai
import pytest
import requests

from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import EMBEDDING_MODEL, TENANT_KEYS

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))
JOB_ID_HEADER = "x-async-inference-job-id"


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A)


def async_sdk(stack: LocalDeployment) -> openai.AsyncOpenAI:
    """A client of its own for each event loop (asyncio.run makes one): its connections are bound to it."""
    return openai.AsyncOpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A)


@pytest.fixture
def embedding_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ENGINE="cpu", MODEL_KIND="embedding")
    warm_up(stack)
    yield process
    stack.stop_worker(process)


def warm_up(stack: LocalDeployment, timeout_s: float = 180) -> None:
    """Wait until a worker answers an embeddings job: the CPU embedding worker loads its model before it receives,
    which takes longer than a held request waits on a loaded machine."""
    headers = {"x-api-key": KEY_A, "Content-Type": "application/json"}
    body = {"endpoint": "/v1/embeddings", "request": {"model": EMBEDDING_MODEL, "input": "warm up"}}
    job_id = requests.post(f"{stack.api_url}/v1/jobs", data=json.dumps(body), headers=headers, timeout=30).json()[
        "job_id"
    ]
    deadline = time.monotonic() + timeout_s
    while (status := _job(stack, job_id)["status"]) in ("queued", "running"):
        assert time.monotonic() < deadline, f"no embedding worker answered within {timeout_s} s"
        time.sleep(1)
    assert status == "succeeded", status


@pytest.fixture
def short_context_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ECHO_MAX_MODEL_LEN="16")
    yield process
    stack.stop_worker(process)


def _job(stack: LocalDeployment, job_id: str) -> dict:
    answer = requests.get(f"{stack.api_url}/v1/jobs/{job_id}", headers={"x-api-key": KEY_A}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


# --- the official SDK, sync ------------------------------------------------------------------------------------------


def test_chat_completions_create_is_answered_with_the_jobs_chat_completion(stack, sdk, worker):
    # GIVEN an echo worker WHEN the SDK creates a chat completion, as it would against OpenAI
    raw = sdk.chat.completions.with_raw_response.create(
        model="echo-model", messages=[{"role": "user", "content": "the quick brown fox"}]
    )
    completion = raw.parse()
    # THEN the answer is the chat.completion the job produced, and the header names that job, which succeeded
    assert completion.object == "chat.completion" and completion.choices[0].message.content == "the quick brown fox"
    assert completion.usage.completion_tokens == 4 and completion.choices[0].finish_reason == "stop"
    job = _job(stack, raw.headers[JOB_ID_HEADER])
    assert (job["status"], job["priority"], job["model"]) == ("succeeded", "interactive", "echo-model")


def test_completions_create_is_answered_with_a_text_completion(sdk, worker):
    # GIVEN an echo worker WHEN the SDK creates a legacy text completion THEN the prompt is continued verbatim
    completion = sdk.completions.create(model="echo-model", prompt="Say this is a test", max_tokens=16)
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.choices[0].text == "Say this is a test" and completion.usage.completion_tokens == 5


def test_a_response_without_background_is_answered_once_it_completed(stack, sdk, worker):
    # GIVEN an echo worker WHEN the SDK creates a response as it would against OpenAI (no background)
    raw = sdk.responses.with_raw_response.create(model="echo-model", input="hello there", instructions="repeat")
    response = raw.parse()
    # THEN the answer is the completed Response, not background, and its job is named
    assert (response.status, response.background, response.output_text) == ("completed", False, "hello there")
    assert response.usage.output_tokens == 2
    assert _job(stack, raw.headers[JOB_ID_HEADER])["status"] == "succeeded"
    assert sdk.responses.retrieve(response.id).output_text == "hello there"


def test_a_request_that_is_too_long_for_the_context_is_a_400_context_length_exceeded(sdk, short_context_worker):
    # GIVEN a worker whose model's context is 16 words WHEN a prompt of 20 is sent
    prompt = " ".join(["word"] * 20)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="echo-model", messages=[{"role": "user", "content": prompt}])
    # THEN it is the client's error, OpenAI's code, which the SDK does not retry
    assert caught.value.code == "context_length_exceeded" and "maximum context length" in caught.value.message
    # AND a background response that is too long fails with the same code, not server_error
    created = sdk.responses.create(model="echo-model", input=prompt, background=True)
    deadline = time.monotonic() + 60
    while (response := sdk.responses.retrieve(created.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert response.status == "failed" and response.error.code == "context_length_exceeded"


def test_a_chat_job_past_the_maximum_wait_is_a_504_naming_the_job_which_goes_on(stack, sdk):
    # GIVEN no worker WHEN the SDK creates a chat completion THEN after the maximum wait it gets a 504 naming the job,
    # once (not retried: a retry would queue the request again)
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(model="echo-model", messages=[{"role": "user", "content": "later"}])
    assert time.monotonic() - started < 29
    job_id = caught.value.response.headers[JOB_ID_HEADER]
    assert caught.value.status_code == 504 and caught.value.code == "job_still_running"
    assert job_id in caught.value.message
    # AND the job goes on: still queued, for the next worker
    assert _job(stack, job_id)["status"] == "queued"
    requests.post(f"{stack.api_url}/v1/jobs/{job_id}/cancel", headers={"x-api-key": KEY_A}, timeout=10)


# --- the official SDK, async -----------------------------------------------------------------------------------------


def test_the_async_sdk_gets_chat_completions_and_responses_at_once(stack, worker):
    # GIVEN an echo worker WHEN the async SDK sends a chat completion and a completion together, then a response
    async def requests_():
        async with async_sdk(stack) as sdk:
            together = await asyncio.gather(
                sdk.chat.completions.create(model="echo-model", messages=[{"role": "user", "content": "one two"}]),
                sdk.completions.create(model="echo-model", prompt="three four"),
            )
            return *together, await sdk.responses.create(model="echo-model", input="five six")

    chat, completion, response = asyncio.run(requests_())
    # THEN each is answered with its own object
    assert chat.choices[0].message.content == "one two" and completion.choices[0].text == "three four"
    assert response.output_text == "five six"


# --- embeddings ------------------------------------------------------------------------------------------------------


def test_embeddings_create_sync_and_async_are_answered_with_the_models_vectors(stack, sdk, embedding_worker):
    # GIVEN the CPU embedding worker WHEN the SDK (base64 by default) and the async SDK (floats) embed texts
    answer = sdk.embeddings.create(model=EMBEDDING_MODEL, input=["A man is eating food.", "A man eats bread."])

    async def embed():
        async with async_sdk(stack) as client:
            return await client.embeddings.create(model=EMBEDDING_MODEL, input="Stocks fell.", encoding_format="float")

    floats = asyncio.run(embed())
    # THEN both are the embedding list, of the model's dimension
    assert [len(d.embedding) for d in answer.data] == [384, 384] and answer.usage.prompt_tokens > 0
    assert len(floats.data[0].embedding) == 384


def test_langchain_openai_embeddings_embeds_documents_and_a_query(stack, embedding_worker):
    langchain_openai = pytest.importorskip("langchain_openai")
    # GIVEN LangChain's OpenAIEmbeddings on the stack; it sends text (not OpenAI's token ids) when told not to
    # tokenize, as it must be for any model but OpenAI's
    embeddings = langchain_openai.OpenAIEmbeddings(
        model=EMBEDDING_MODEL, base_url=stack.api_url + "/v1", api_key=KEY_A, check_embedding_ctx_length=False
    )
    # WHEN it embeds documents and a query THEN each is a vector of the model's dimension
    documents = embeddings.embed_documents(["A man is eating food.", "The stock market fell."])
    query = embeddings.embed_query("Someone eats.")
    assert [len(v) for v in (*documents, query)] == [384, 384, 384]


# --- LangChain chat --------------------------------------------------------------------------------------------------


def test_langchain_chat_openai_invoke_is_answered(stack, worker):
    langchain_openai = pytest.importorskip("langchain_openai")
    # GIVEN LangChain's ChatOpenAI with only a base URL and a key WHEN it is invoked THEN the echoed answer is its
    # message, with the tokens it used
    chat = langchain_openai.ChatOpenAI(model="echo-model", base_url=stack.api_url + "/v1", api_key=KEY_A)
    message = chat.invoke("the answer is forty two")
    assert message.content == "the answer is forty two"
    assert message.usage_metadata["output_tokens"] == 5


# --- POST /v1/jobs ---------------------------------------------------------------------------------------------------


def test_a_job_for_v1_completions_is_accepted_and_runs_its_prompt(stack, worker):
    # GIVEN a completions body, as a batch line for /v1/completions takes it WHEN it is posted as a job, waiting
    headers = {"x-api-key": KEY_A, "Content-Type": "application/json", "Prefer": "wait=20"}
    body = {"endpoint": "/v1/completions", "request": {"model": "echo-model", "prompt": "once upon a time"}}
    answer = requests.post(f"{stack.api_url}/v1/jobs", data=json.dumps(body), headers=headers, timeout=30)
    # THEN it is accepted, and ends with the prompt continued verbatim, within the wait it asked for
    assert answer.status_code == 200, answer.text
    assert (
        answer.headers["Preference-Applied"] == "wait=20" and answer.headers[JOB_ID_HEADER] == answer.json()["job_id"]
    )
    view = answer.json()
    assert view["status"] == "succeeded" and view["usage"]["completion_tokens"] == 4


def test_prefer_wait_answers_the_job_as_it_stands_once_the_wait_is_over(stack):
    # GIVEN no worker WHEN a job is posted with Prefer: wait=1 THEN after about a second it is answered queued (202)
    headers = {"x-api-key": KEY_A, "Content-Type": "application/json", "Prefer": "respond-async, wait=1"}
    body = {"request": {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}}
    started = time.monotonic()
    answer = requests.post(f"{stack.api_url}/v1/jobs", data=json.dumps(body), headers=headers, timeout=30)
    assert 1 <= time.monotonic() - started < 10
    assert answer.status_code == 202 and answer.json()["status"] == "queued", answer.text
    assert answer.headers["Preference-Applied"] == "wait=1"
    requests.post(f"{stack.api_url}/v1/jobs/{answer.json()['job_id']}/cancel", headers=headers, timeout=10)


def test_a_retry_with_the_same_idempotency_key_is_answered_from_the_same_job(stack, worker):
    # GIVEN a held chat request sent with an Idempotency-Key WHEN it is sent again with the same key
    headers = {"Authorization": f"Bearer {KEY_A}", "Content-Type": "application/json", "Idempotency-Key": "held-1"}
    body = json.dumps({"model": "echo-model", "messages": [{"role": "user", "content": "only once"}]})
    first, second = (
        requests.post(f"{stack.api_url}/v1/chat/completions", data=body, headers=headers, timeout=30) for _ in range(2)
    )
    # THEN both are answered with the one job's chat.completion
    assert (first.status_code, second.status_code) == (200, 200), second.text
    assert first.headers[JOB_ID_HEADER] == second.headers[JOB_ID_HEADER] and first.json() == second.json()


def test_a_held_route_refuses_a_body_that_is_not_json_with_a_415_and_broken_json_with_a_400(stack):
    headers = {"Authorization": f"Bearer {KEY_A}"}
    url = f"{stack.api_url}/v1/embeddings"
    as_text = requests.post(url, data="hello", headers={**headers, "Content-Type": "text/plain"}, timeout=10)
    broken = requests.post(url, data="{", headers={**headers, "Content-Type": "application/json"}, timeout=10)
    assert as_text.status_code == 415 and as_text.json()["error"]["code"] == "unsupported_media_type"
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_json"


def test_a_completion_with_more_stop_sequences_than_a_chat_request_takes_is_a_400_naming_stop(sdk):
    # GIVEN five stop sequences (the chat request the prompt runs as takes four) WHEN a completion is created THEN a
    # 400 names stop (it was a 500: the conversion's error escaped the route)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model="echo-model", prompt="x", stop=["a", "b", "c", "d", "e"])
    assert caught.value.body["details"][0]["field"] == "stop" and "4 stop sequences" in caught.value.message


def test_a_request_for_a_model_of_the_other_kind_is_a_400_at_once_naming_its_route(stack):
    # GIVEN the local stack's models: echo-model a chat model, the embedding engine's model an embedding model
    headers = {"x-api-key": KEY_A, "Content-Type": "application/json"}
    as_job = {"endpoint": "/v1/embeddings", "request": {"model": "echo-model", "input": "text"}}
    # WHEN an embeddings job, and a held embeddings request, name the chat model, and a chat request the other
    job = requests.post(f"{stack.api_url}/v1/jobs", data=json.dumps(as_job), headers=headers, timeout=10)
    held = requests.post(
        f"{stack.api_url}/v1/embeddings", data=json.dumps(as_job["request"]), headers=headers, timeout=10
    )
    chat = {"model": EMBEDDING_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    other = requests.post(f"{stack.api_url}/v1/chat/completions", data=json.dumps(chat), headers=headers, timeout=10)
    # THEN each is a 400 model_kind_mismatch at once, naming where that model's requests go, and no job is made (it
    # was accepted, and failed on the worker)
    for answer, route in ((job, "/v1/chat/completions"), (held, "/v1/chat/completions"), (other, "/v1/embeddings")):
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "model_kind_mismatch", answer.text
        assert route in answer.json()["error"]["message"] and JOB_ID_HEADER not in answer.headers
