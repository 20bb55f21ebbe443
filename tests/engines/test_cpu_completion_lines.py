"""A /v1/completions batch line on the CPU chat engine (SmolLM2): the raw prompt is continued, no chat template, and
the answer is OpenAI's text_completion; a /v1/responses line is the chat request a background response runs."""

from __future__ import annotations

import openai.types
import pytest

from async_inference.endpoints import parse_line_body
from gpu_worker import answers
from gpu_worker.engines.base import PermanentEngineError
from gpu_worker.engines.cpu import CpuEngine
from gpu_worker.engines.echo import EchoEngine

SUFFIX = "0" * 32


@pytest.fixture(scope="module")
def engine(run):
    engine = CpuEngine(capacity=2, max_model_len=2048)
    run(engine.start())
    yield engine
    run(engine.close())


def test_a_completions_line_continues_the_raw_prompt_and_answers_a_text_completion(engine, run):
    # GIVEN a completions body with a prompt that is no chat message
    prompt = "The capital of France is"
    request = parse_line_body("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 5, "temperature": 0})

    # WHEN it runs on the chat engine
    output = run(answers.run(engine, "c1", request))
    body = answers.body(request, output, suffix=SUFFIX).model_dump(mode="json")

    # THEN the prompt the model saw is the prompt's own tokens (no role markers), and the answer parses as the SDK's
    # Completion, its text the continuation
    assert output.prompt_tokens == len(engine._tokenizer.encode(prompt, add_special_tokens=False))
    completion = openai.types.Completion.model_validate(body)
    assert completion.object == "text_completion" and completion.id == f"cmpl-{SUFFIX}"
    assert completion.choices[0].text == output.text and completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens <= 5


def test_a_responses_line_answers_a_completed_response(engine, run):
    # GIVEN a responses body as OpenAI's batch lines carry it (no background, store false)
    body = {"model": "m", "input": "Say hi", "instructions": "Be brief.", "max_output_tokens": 8, "store": False}
    request = parse_line_body("/v1/responses", body)

    # WHEN it runs THEN the answer parses as the SDK's Response, with its output text and usage
    output = run(answers.run(engine, "r1", request))
    response = openai.types.responses.Response.model_validate(
        answers.body(request, output, suffix=SUFFIX).model_dump(mode="json")
    )
    assert response.id == f"resp_{SUFFIX}" and response.status in ("completed", "incomplete")
    assert response.output_text == output.text and response.usage.output_tokens == output.completion_tokens


def test_the_vllm_engine_refuses_a_completions_line_by_name(run):
    # GIVEN an engine named vllm (the echo engine standing in: the refusal comes before the engine is asked)
    engine = EchoEngine()
    engine.name = "vllm"
    request = parse_line_body("/v1/completions", {"model": "m", "prompt": "x"})
    with pytest.raises(PermanentEngineError, match="/v1/completions lines are not run by the vLLM engine"):
        run(answers.run(engine, "v1", request))
