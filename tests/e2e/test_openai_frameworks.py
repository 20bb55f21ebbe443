"""pydantic-ai's OpenAI model and LiteLLM's OpenAI provider, unmodified, pointed at the local stack with only a base URL
and a key (issue 28): each gets the answer, whole and streamed. The echo engine answers a prompt with its words."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.e2e.conftest import TENANT_KEYS

# LiteLLM fetches a price list from GitHub when imported unless told to read its packaged copy; the tests run offline.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

pytestmark = pytest.mark.e2e
KEY_A = next(iter(TENANT_KEYS))
PROMPT = "the answer is forty two"


def _agent(stack):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=stack.api_url + "/v1", api_key=KEY_A)
    return pydantic_ai.Agent(OpenAIChatModel("echo-model", provider=provider))


def test_a_pydantic_ai_agent_on_the_openai_model_gets_the_answer(stack, worker):
    # GIVEN pydantic-ai's Agent on its OpenAI chat model, with only a base URL and a key
    agent = _agent(stack)
    # WHEN it runs a prompt THEN its output is the answer, with the tokens the job used
    result = agent.run_sync(PROMPT)
    assert result.output == PROMPT
    assert result.usage().output_tokens == 5


def test_a_pydantic_ai_agent_streams_the_answer(stack, worker):
    # GIVEN the same agent WHEN it streams a prompt's answer THEN the text it streamed, joined, is the answer
    agent = _agent(stack)

    async def streamed() -> list[str]:
        async with agent.run_stream(PROMPT) as run:
            return [text async for text in run.stream_text(delta=True)]

    assert "".join(asyncio.run(streamed())) == PROMPT


def test_litellms_openai_provider_gets_the_answer_whole_and_streamed(stack, worker):
    litellm = pytest.importorskip("litellm")
    # GIVEN LiteLLM's OpenAI provider (model "openai/<name>") with only a base URL and a key
    options = {"model": "openai/echo-model", "api_base": stack.api_url + "/v1", "api_key": KEY_A}
    messages = [{"role": "user", "content": PROMPT}]
    # WHEN it completes a chat, then streams one
    whole = litellm.completion(messages=messages, **options)
    chunks = list(litellm.completion(messages=messages, stream=True, **options))
    # THEN the answer is the message, and the streamed deltas joined are the same answer
    assert whole.choices[0].message.content == PROMPT and whole.usage.completion_tokens == 5
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == PROMPT
