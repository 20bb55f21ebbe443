"""Embeddings end to end with the official ``openai`` SDK, unmodified, against the local stack: a batch of
``/v1/embeddings`` lines run by a worker started with the CPU embedding engine on the real all-MiniLM-L6-v2.

The stack's workers run the echo engine; the embedding worker is one started here as the template's task definition
says, with ``ENGINE=cpu`` and ``MODEL_KIND=embedding`` (docs/design/embeddings.md), as a fleet of the embedding model
would run it. Only it runs while these tests do, so every line reaches it.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator

import openai
import pytest
import requests

from async_inference.schemas import decode_vector
from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import EMBEDDING_MODEL, TENANT_KEYS
from tests.e2e.test_batches_openai import jsonl, settled, until, upload

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))
TEXTS = {
    "food": "A man is eating food.",
    "bread": "A man is eating a piece of bread.",
    "market": "The stock market fell sharply this morning.",
}


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def embedding_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ENGINE="cpu", MODEL_KIND="embedding")
    yield process
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


def embeddings_line(custom_id: str, **body: object) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": EMBEDDING_MODEL, **body},
    }


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_a_batch_of_embeddings_lines_gives_one_384_vector_per_line_and_a_paraphrase_is_closer(
    stack, sdk, embedding_worker
):
    # GIVEN an input file of /v1/embeddings lines: one text each (floats and base64), a list of two texts, and two
    # lines the model cannot answer (a token array, a dimensions MiniLM cannot give)
    lines = [
        embeddings_line("food", input=TEXTS["food"]),
        embeddings_line("bread", input=TEXTS["bread"], encoding_format="base64"),
        embeddings_line("market", input=TEXTS["market"]),
        embeddings_line("pair", input=[TEXTS["food"], TEXTS["market"]]),
        embeddings_line("tokens", input=[101, 7592, 102]),
        embeddings_line("short", input="cut me", dimensions=64),
    ]
    source = upload(sdk, jsonl(lines))

    # WHEN the SDK creates the batch for /v1/embeddings and it runs
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/embeddings", completion_window="24h")
    done = settled(sdk, batch.id, "completed", "failed", timeout_s=180)

    # THEN four lines succeeded and two are 400s naming the field to fix
    assert done.status == "completed", done.errors
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 2)
    rows = {r["custom_id"]: r for r in map(json.loads, sdk.files.content(done.output_file_id).read().splitlines())}
    assert isinstance(rows["bread"]["response"]["body"]["data"][0]["embedding"], str)  # base64 as asked
    for row in rows.values():  # base64 decoded as the SDK's embeddings.create decodes it, then the SDK's type
        for item in row["response"]["body"]["data"]:
            item["embedding"] = decode_vector(item["embedding"])
    parsed = {
        custom_id: openai.types.CreateEmbeddingResponse.model_validate(row["response"]["body"])
        for custom_id, row in rows.items()
    }
    assert sorted(parsed) == ["bread", "food", "market", "pair"]
    vectors = {custom_id: [e.embedding for e in answer.data] for custom_id, answer in parsed.items()}
    assert all(len(v) == 384 for vs in vectors.values() for v in vs)
    assert [len(vectors[c]) for c in ("food", "bread", "market", "pair")] == [1, 1, 1, 2]
    assert all(a.object == "list" and a.model == EMBEDDING_MODEL and a.usage.prompt_tokens > 0 for a in parsed.values())
    # a paraphrase is closer than unrelated text, and a text's vector is the same in a list as alone
    food, bread, market = vectors["food"][0], vectors["bread"][0], vectors["market"][0]
    assert cosine(food, bread) > cosine(food, market) + 0.3
    assert cosine(vectors["pair"][0], food) > 0.9999 and cosine(vectors["pair"][1], market) > 0.9999
    errors = {r["custom_id"]: r for r in map(json.loads, sdk.files.content(done.error_file_id).read().splitlines())}
    assert errors["tokens"]["response"]["status_code"] == 400
    assert errors["tokens"]["response"]["body"]["error"]["param"] == "input"
    assert errors["short"]["response"]["status_code"] == 400
    assert errors["short"]["response"]["body"]["error"]["message"].startswith("dimensions: ")


def test_an_embeddings_job_ends_with_an_embedding_list_result_and_a_notification(stack, subscriber, embedding_worker):
    # GIVEN an embeddings job (POST /v1/jobs with endpoint /v1/embeddings), two texts in base64
    body = {
        "endpoint": "/v1/embeddings",
        "request": {"model": EMBEDDING_MODEL, "input": [TEXTS["food"], TEXTS["bread"]]},
    }
    body["request"]["encoding_format"] = "base64"
    headers = {"x-api-key": KEY_A, "Content-Type": "application/json"}
    submitted = requests.post(f"{stack.api_url}/v1/jobs", data=json.dumps(body), headers=headers, timeout=10)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["job_id"]

    # WHEN the embedding worker runs it
    def final() -> dict | None:
        view = requests.get(f"{stack.api_url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        return view if view["status"] in ("succeeded", "failed") else None

    view = until(final, timeout_s=120)

    # THEN it succeeded with the prompt tokens as its usage, its result is OpenAI's embedding list (the SDK's type
    # parses it once base64 is decoded), and its notification carries the same result inline
    assert view and view["status"] == "succeeded", view
    assert view["usage"]["prompt_tokens"] > 0 and view["usage"]["completion_tokens"] == 0
    result = requests.get(view["result"]["url"], timeout=10).json()
    assert result["job_id"] == job_id and [d["index"] for d in result["data"]] == [0, 1]
    for item in result["data"]:
        item["embedding"] = decode_vector(item["embedding"])
    parsed = openai.types.CreateEmbeddingResponse.model_validate(result)
    assert [len(d.embedding) for d in parsed.data] == [384, 384]
    assert cosine(parsed.data[0].embedding, parsed.data[1].embedding) > 0.6
    notes = subscriber.for_job(job_id, wait_s=5)
    assert [n["status"] for n in notes] == ["succeeded"] and notes[0]["result"]["object"] == "list"


def test_an_embeddings_job_with_a_chat_body_or_a_token_array_is_a_400_naming_the_field(stack):
    headers = {"x-api-key": KEY_A, "Content-Type": "application/json"}
    chat = {"model": EMBEDDING_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for body, field in (
        ({"endpoint": "/v1/embeddings", "request": chat}, "request"),
        ({"endpoint": "/v1/embeddings", "request": {"model": EMBEDDING_MODEL, "input": [1, 2]}}, "request.input"),
    ):
        response = requests.post(f"{stack.api_url}/v1/jobs", data=json.dumps(body), headers=headers, timeout=10)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["details"][0]["field"] == field


def test_the_projects_client_submits_an_embeddings_job_and_reads_its_vectors(stack, embedding_worker):
    # GIVEN the project's SDK on the stack WHEN it submits an embeddings body with its endpoint and waits
    with Client(stack.api_url, KEY_A, ws_url="") as client:
        job = client.submit(
            {"model": EMBEDDING_MODEL, "input": [TEXTS["food"], TEXTS["bread"], TEXTS["market"]]},
            endpoint="/v1/embeddings",
        )
        final = client.wait(job.job_id, timeout_s=120)
        answer = client.embeddings(final)
    # THEN its result is the embedding list: three vectors of the model's dimension, the paraphrase the closest
    assert final.status == "succeeded", final.error
    food, bread, market = (d.vector() for d in answer.data)
    assert [len(v) for v in (food, bread, market)] == [384, 384, 384]
    assert cosine(food, bread) > cosine(food, market)
