"""The vLLM embedding adapter's translation of vLLM's answers, without vLLM (the engine itself runs in
checks/vllm_cpu_embedding_check.py, part of make vllm-cpu-check)."""

from __future__ import annotations

import json

import pytest

from gpu_worker.engines import make_engine
from gpu_worker.engines.base import PermanentEngineError, TransientEngineError
from gpu_worker.engines.vllm_embedding import VllmEmbeddingEngine


class JSONResponse:
    """What vLLM's ServingEmbedding returns: a starlette JSONResponse (status_code, body bytes)."""

    def __init__(self, payload: dict, status_code: int = 200) -> None:
        self.body = json.dumps(payload).encode()
        self.status_code = status_code


def test_vllms_answer_becomes_the_vectors_in_input_order_and_its_prompt_tokens():
    # GIVEN vLLM's embedding list, its items out of order
    payload = {
        "object": "list",
        "data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}],
        "usage": {"prompt_tokens": 9, "total_tokens": 9},
    }
    # WHEN the adapter reads it THEN the vectors are in input order with vLLM's token count
    got = VllmEmbeddingEngine._embeddings(JSONResponse(payload))
    assert got.vectors == ((1.0, 0.0), (0.0, 1.0)) and got.prompt_tokens == 9


@pytest.mark.parametrize(("status", "error"), [(400, PermanentEngineError), (500, TransientEngineError)])
def test_an_error_response_is_permanent_when_4xx_and_transient_when_5xx(status, error):
    payload = {"error": {"message": "too long", "type": "BadRequestError", "code": status}}
    with pytest.raises(error, match="too long"):
        VllmEmbeddingEngine._embeddings(JSONResponse(payload, status))


def test_the_vllm_embedding_engine_is_the_pooling_runner_and_takes_the_workers_vllm_options():
    # GIVEN the options the worker passes to every vllm engine (tool_call_parser included)
    engine = make_engine("vllm", kind="embedding", model="/models/minilm", max_num_seqs=16, tool_call_parser="hermes")
    # THEN it is the embedding flavour, on vLLM's pooling runner, nothing started
    assert isinstance(engine, VllmEmbeddingEngine) and engine.capacity == 16
    assert engine._engine_kwargs["runner"] == "pooling" and "tool_call_parser" not in engine._engine_kwargs


def test_the_vllm_embedding_engine_takes_the_vllm_options_and_no_other():
    # GIVEN every vLLM option, with engine_kwargs over the others
    engine = make_engine(
        "vllm",
        kind="embedding",
        model="/models/minilm",
        max_model_len=256,
        gpu_memory_utilization=0.5,
        tensor_parallel_size=1,
        dtype="float32",
        enforce_eager=True,
        served_model_name="minilm",
        engine_kwargs={"dtype": "bfloat16"},
    )
    # THEN they reach vLLM's arguments as vllm run-batch names them
    assert engine._engine_kwargs == {
        "model": "/models/minilm",
        "runner": "pooling",
        "max_num_seqs": 64,
        "max_model_len": 256,
        "gpu_memory_utilization": 0.5,
        "tensor_parallel_size": 1,
        "dtype": "bfloat16",
        "enforce_eager": True,
        "served_model_name": ["minilm"],
    }
    # while a chat engine's own option (seed) and a missing model are refused
    with pytest.raises(TypeError, match="seed"):
        make_engine("vllm", kind="embedding", model="/models/minilm", seed=1)
    with pytest.raises(ValueError, match="env MODEL"):
        make_engine("vllm", kind="embedding")
