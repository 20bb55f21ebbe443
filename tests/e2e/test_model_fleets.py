"""Several models, each its own fleet, on the local stack deployed from a three-model template (issue 20): the local
runtime starts one worker fleet per ECS service, and each job reaches its model's fleet only."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from async_inference_client import Client
from async_inference_client.errors import ApiError
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment, local_engine
from local_runtime.synth import synthesize

CHAT = "Qwen/Qwen2.5-1.5B-Instruct"
SECOND = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDING = "sentence-transformers/all-MiniLM-L6-v2"
MODELS = [
    {"name": CHAT},
    {"name": SECOND, "max_num_seqs": 16, "max_worker_tasks": 1, "max_gpu_instances": 1},
    {"name": EMBEDDING, "kind": "embedding", "max_num_seqs": 64, "max_worker_tasks": 1, "max_gpu_instances": 1},
]
KEY = "fleets-key-0123456789"
FAST_WORKER = {"RECEIVE_WAIT_S": "1", "HEARTBEAT_INTERVAL_S": "1", "DRAIN_TIMEOUT_S": "5"}


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalDeployment]:
    """The three-model stack, its first model's fleet with one worker, the others' with none (each test starts
    them)."""
    assembly = synthesize(
        tmp_path_factory.mktemp("cdk.out.fleets"), {"tenants": {"fleets": {}}, "models": json.dumps(MODELS)}
    )
    logs = tmp_path_factory.mktemp("fleet-logs")
    local = LocalDeployment(
        assembly=assembly,
        api_port=free_port(),
        moto_port=free_port(),
        api_keys={KEY: "fleets"},
        workers={"gpu-workers": 1},
        engine="echo",
        worker_env=FAST_WORKER,
        worker_log=open(logs / "workers.log", "ab"),
        log_dir=logs,
        served_models=[CHAT, SECOND, EMBEDDING],
    ).start()
    yield local
    local.stop()


def _depth(stack: LocalDeployment, url: str) -> int:
    attributes = stack.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def _body(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": f"hello {model}"}], "max_tokens": 8}


def test_the_local_runtime_runs_one_fleet_per_model_service_on_its_own_queue(fleets: LocalDeployment):
    """GIVEN the three-model template WHEN deployed locally THEN there is one worker fleet per ECS service, each on
    its own job queue, the embedding model's on the local embedding engine."""
    assert list(fleets.fleets) == ["gpu-workers", "gpu-workers-all-minilm-l6-v2", "gpu-workers-smollm2-135m-instruct"]
    queues = {name: fleet.environment()["JOBS_QUEUE_URL"] for name, fleet in fleets.fleets.items()}
    assert len(set(queues.values())) == 3
    assert queues["gpu-workers"] == fleets.resources.config.queue_url
    engines = {name: fleet.environment()["ENGINE"] for name, fleet in fleets.fleets.items()}
    assert engines["gpu-workers-all-minilm-l6-v2"] == local_engine("embedding", "echo")
    assert {name: fleet.environment()["MODEL_KIND"] for name, fleet in fleets.fleets.items()} == {
        "gpu-workers": "chat",
        "gpu-workers-all-minilm-l6-v2": "embedding",
        "gpu-workers-smollm2-135m-instruct": "chat",
    }


def test_a_job_runs_on_its_models_fleet_only(fleets: LocalDeployment):
    """GIVEN the second model's fleet without a worker WHEN a job for each chat model is submitted THEN the first
    model's job succeeds on its fleet while the second's waits on its own queue; once the second model's service
    gets a worker, its job succeeds too."""
    api = Client(fleets.api_url, KEY)
    second_queue = fleets.fleets["gpu-workers-smollm2-135m-instruct"].environment()["JOBS_QUEUE_URL"]
    first = api.submit(_body(CHAT))
    second = api.submit(_body(SECOND))
    assert api.wait(first.job_id, timeout_s=60).status == "succeeded"
    assert api.get(second.job_id).status == "queued" and _depth(fleets, second_queue) == 1
    worker = fleets.start_worker(service="gpu-workers-smollm2-135m-instruct")
    try:
        done = api.wait(second.job_id, timeout_s=60)
    finally:
        fleets.stop_worker(worker)
    assert done.status == "succeeded" and _depth(fleets, second_queue) == 0


def test_models_lists_every_model_and_a_request_of_the_wrong_kind_or_model_is_refused(fleets: LocalDeployment):
    """GIVEN the three-model stack WHEN GET /v1/models, and chat jobs for the embedding model and an unknown model THEN
    the list names all three; the embedding model is a 400 naming /v1/embeddings and the unknown one a 404 naming it."""
    request = urllib.request.Request(f"{fleets.api_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        listed = json.load(answer)
    assert [m["id"] for m in listed["data"]] == [CHAT, SECOND, EMBEDDING]
    api = Client(fleets.api_url, KEY)
    with pytest.raises(ApiError) as wrong_kind:
        api.submit(_body(EMBEDDING))
    with pytest.raises(ApiError) as unknown:
        api.submit(_body("org/unknown"))
    assert (wrong_kind.value.status, wrong_kind.value.code) == (400, "model_kind_mismatch")
    assert "/v1/embeddings" in wrong_kind.value.message
    assert unknown.value.status == 404 and "`org/unknown`" in unknown.value.message
    deadline = time.monotonic() + 2
    embedding_queue = fleets.fleets["gpu-workers-all-minilm-l6-v2"].environment()["JOBS_QUEUE_URL"]
    while time.monotonic() < deadline:
        assert _depth(fleets, embedding_queue) == 0
        time.sleep(0.5)


def test_local_engine_is_the_one_seam_for_the_engine_of_a_model_kind():
    """GIVEN the local engine choice WHEN asked per kind THEN chat fleets run the engine asked for, embedding fleets
    the CPU embedding engine whatever the chat fleets run (echo has no embedding flavour), vLLM serves both kinds."""
    assert [local_engine("chat", e) for e in ("cpu", "echo", "vllm")] == ["cpu", "echo", "vllm"]
    assert [local_engine("embedding", e) for e in ("cpu", "echo", "vllm")] == ["cpu", "cpu", "vllm"]


def test_an_embeddings_job_runs_on_the_embedding_models_fleet(fleets: LocalDeployment):
    """GIVEN the embedding model's fleet with a worker (the CPU embedding engine: all-MiniLM-L6-v2) WHEN an embeddings
    job names that model THEN it waits on that fleet's queue only and is answered with the model's vectors; an
    embeddings job for a chat model is a 400 naming /v1/chat/completions."""
    api = Client(fleets.api_url, KEY)
    embedding_queue = fleets.fleets["gpu-workers-all-minilm-l6-v2"].environment()["JOBS_QUEUE_URL"]
    body = {"model": EMBEDDING, "input": ["A man is eating food.", "A man eats bread.", "Stocks fell sharply."]}
    job = api.submit(body, endpoint="/v1/embeddings")
    assert _depth(fleets, embedding_queue) == 1
    worker = fleets.start_worker(service="gpu-workers-all-minilm-l6-v2")
    try:
        done = api.wait(job.job_id, timeout_s=120)
    finally:
        fleets.stop_worker(worker)
    assert done.status == "succeeded", done.error
    food, bread, stocks = (d.vector() for d in api.embeddings(done).data)
    assert len(food) == 384 and _cosine(food, bread) > _cosine(food, stocks)
    with pytest.raises(ApiError) as wrong_kind:
        api.submit({"model": CHAT, "input": "text"}, endpoint="/v1/embeddings")
    assert (wrong_kind.value.status, wrong_kind.value.code) == (400, "model_kind_mismatch")
    assert "/v1/chat/completions" in wrong_kind.value.message


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5


def _batch_file(model: str, lines: int = 3) -> bytes:
    return "\n".join(
        json.dumps({"custom_id": f"l{n}", "method": "POST", "url": "/v1/chat/completions", "body": _body(model)})
        for n in range(lines)
    ).encode()


def test_a_batch_runs_on_its_models_lane_and_a_chat_batch_for_the_embedding_model_fails(fleets: LocalDeployment):
    """GIVEN the three-model stack WHEN a batch of the second model's lines runs THEN its chunks go to the second
    model's lane and its fleet's worker completes it; a chat batch for the embedding model fails, naming the kind."""
    api = Client(fleets.api_url, KEY)
    second_lane = fleets.fleets["gpu-workers-smollm2-135m-instruct"].environment()["BATCH_QUEUE_URL"]
    first_lane = fleets.fleets["gpu-workers"].environment()["BATCH_QUEUE_URL"]
    assert second_lane != first_lane
    batch = api.create_batch(api.upload_file(_batch_file(SECOND)).id)
    deadline = time.monotonic() + 30
    while _depth(fleets, second_lane) == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _depth(fleets, second_lane) == 1 and _depth(fleets, first_lane) == 0  # one chunk, on its model's lane
    worker = fleets.start_worker(service="gpu-workers-smollm2-135m-instruct")
    try:
        done = api.wait_batch(batch.id, timeout_s=90)
    finally:
        fleets.stop_worker(worker)
    assert done.status == "completed" and done.request_counts.completed == 3
    wrong = api.wait_batch(api.create_batch(api.upload_file(_batch_file(EMBEDDING)).id).id, timeout_s=60)
    assert wrong.status == "failed" and wrong.errors.data[0].code == "model_kind_mismatch"
    assert "/v1/embeddings" in wrong.errors.data[0].message
