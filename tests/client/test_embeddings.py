"""An embeddings job through the SDK: submitted with its endpoint, its embedding list read from the result URL."""

from __future__ import annotations

import asyncio
import base64
import struct

import pytest

from async_inference_client import AsyncClient, Client, NoResult
from tests.client.fake_api import JOB_ID, FakeApi, Reply, Seen, job_view, succeeded_view

KEY = "test-key-0123456789abcdef"
VECTOR = [0.25, -0.5, 0.125]


def embedding_list(encoding: str) -> dict:
    packed = base64.b64encode(struct.pack("<3f", *VECTOR)).decode()
    embedding = packed if encoding == "base64" else VECTOR
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": embedding}],
        "model": "all-MiniLM-L6-v2",
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
        "job_id": JOB_ID,
    }


def api_of(encoding: str) -> FakeApi:
    def respond(seen: Seen) -> Reply:
        if seen.path.startswith("/results/"):
            return Reply(200, embedding_list(encoding))
        if seen.method == "POST":
            return Reply(202, job_view("queued"))
        return Reply(200, succeeded_view(api.url))

    api = FakeApi(respond)
    return api


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_an_embeddings_job_is_submitted_with_its_endpoint_and_its_vectors_read_back(encoding: str):
    # GIVEN the API of a job that has succeeded
    with api_of(encoding) as api:
        client = Client(api.url, KEY, ws_url="")
        # WHEN an embeddings body is submitted with its endpoint, and the job's embeddings are read
        body = {"model": "all-MiniLM-L6-v2", "input": "a text", "encoding_format": encoding}
        client.submit(body, endpoint="/v1/embeddings")
        answer = client.embeddings(JOB_ID)
    # THEN the API got the endpoint beside the body, and the answer is OpenAI's embedding list, floats either way
    [post] = [s for s in api.seen if s.method == "POST"]
    assert post.json()["endpoint"] == "/v1/embeddings" and post.json()["request"] == body
    assert answer.object == "list" and answer.job_id == JOB_ID and answer.usage.prompt_tokens == 4
    assert answer.data[0].vector() == VECTOR


def test_the_async_client_reads_embeddings_too():
    with api_of("float") as api:

        async def read() -> list[float]:
            async with AsyncClient(api.url, KEY, ws_url="") as client:
                return (await client.embeddings(JOB_ID)).data[0].vector()

        assert asyncio.run(read()) == VECTOR


def test_embeddings_of_a_job_that_failed_is_no_result():
    with FakeApi(lambda seen: Reply(200, job_view("failed", error="dimensions: ..."))) as api:
        with pytest.raises(NoResult, match="dimensions"):
            Client(api.url, KEY, ws_url="").embeddings(JOB_ID)
