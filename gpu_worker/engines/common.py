"""What every model-backed engine does the same way, so that the CPU engine and vLLM agree token for token."""

from __future__ import annotations

from typing import Any

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import Asks, asks_of, plain_messages, template_messages
from gpu_worker.engines.base import PromptTooLongError


def chat_prompt_ids(tokenizer: Any, request: ChatCompletionRequest | Asks) -> list[int]:
    """The request's prompt as vLLM's chat endpoint builds it: the tokenizer's chat template with the assistant turn
    opened, then tokenised without adding special tokens (the template has them already).

    A template that takes ``tools`` (Qwen2.5's, Llama 3.1's...) gets the messages and tools as they are; one that does
    not (SmolLM2's) gets them written out as text (``gpu_worker.engines.asks.plain_messages``)."""
    asks = request if isinstance(request, Asks) else asks_of(request)
    options = dict(asks.chat_template_kwargs)
    if asks.tools and "tools" in (getattr(tokenizer, "chat_template", None) or ""):
        options["tools"] = [f.signature() for f in asks.tools]
        messages: list[dict[str, Any]] = template_messages(asks)
    else:
        messages = plain_messages(asks)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **options)
    return list(tokenizer.encode(text, add_special_tokens=False))


def check_context(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse a request whose prompt plus completion cannot fit in the context, as vLLM's OpenAI server does."""
    if prompt_tokens + max_tokens > max_model_len:
        raise PromptTooLongError(
            f"this model's maximum context length is {max_model_len} tokens, but the request needs "
            f"{prompt_tokens + max_tokens} ({prompt_tokens} in the messages, {max_tokens} in max_tokens): "
            "shorten the messages or lower max_tokens"
        )
