"""What every model-backed engine does the same way, so that the CPU engine and vLLM agree token for token.

The prompt is rendered by the model's own chat template only, and its cost is bounded before it is paid, as vLLM's
OpenAI server does:

- a chat template in the request (``chat_template_kwargs.chat_template``) is refused, in vLLM's words (its
  ``--trust-request-chat-template`` is off by default); the one exception is the service's own template for
  ``/v1/completions`` lines (``async_inference.schemas.chat.RAW_PROMPT_TEMPLATE``), which writes the prompt
  verbatim.
  A caller's template is code run on the shared engine: one that loops 15k x 100k times stalled every tenant 50 s;
- the arguments of ``apply_chat_template`` itself (``tokenize``, ``add_generation_prompt``, ``messages``...) are
  refused by name; other keys reach the template only if it reads them, and are dropped otherwise (vLLM's
  ``resolve_chat_template_kwargs`` does the same);
- a template that fails to render (its own ``raise_exception``, a message it cannot take) fails the job as the
  client's: a ``PermanentEngineError``, never a retry;
- a prompt that cannot fit in the context is refused from its length in characters before it is templated and
  tokenised: no token of this tokenizer is longer than ``longest_token_chars``, so a text of more than that many
  characters per token of context left cannot fit (a 15 MB upload was tokenised, for seconds, only to be refused).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from async_inference.schemas import RAW_PROMPT_TEMPLATE, ChatCompletionRequest
from gpu_worker.engines.asks import Asks, asks_of, plain_messages, template_messages, text_of
from gpu_worker.engines.base import PermanentEngineError, PromptTooLongError

TRUSTED_TEMPLATES = frozenset({RAW_PROMPT_TEMPLATE})
UNTRUSTED_TEMPLATE = (
    "chat_template_kwargs.chat_template: Chat template is passed with request, but --trust-request-chat-template is "
    "not set. Refused request with untrusted chat template. The model's own template is used: omit chat_template"
)
# apply_chat_template's own arguments, and what the engine passes the template itself: not the caller's to set.
TEMPLATE_CONTROLS = frozenset(
    {
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "messages",
        "conversation",
        "tools",
        "documents",
        "return_dict",
        "return_tensors",
        "return_assistant_tokens_mask",
        "padding",
        "truncation",
        "max_length",
        "tokenizer_kwargs",
        "processor_kwargs",
    }
)


def chat_prompt_ids(tokenizer: Any, request: ChatCompletionRequest | Asks) -> list[int]:
    """The request's prompt as vLLM's chat endpoint builds it: the tokenizer's chat template with the assistant turn
    opened, then tokenised without adding special tokens (the template has them already).

    A template that takes ``tools`` (Qwen2.5's, Llama 3.1's...) gets the messages and tools as they are; one that does
    not (SmolLM2's) gets them written out as text (``gpu_worker.engines.asks.plain_messages``)."""
    asks = request if isinstance(request, Asks) else asks_of(request)
    options = template_options(tokenizer, asks.chat_template_kwargs)
    template = options.get("chat_template") or getattr(tokenizer, "chat_template", None) or ""
    if asks.tools and "tools" in template:
        options["tools"] = [f.signature() for f in asks.tools]
        messages: list[dict[str, Any]] = template_messages(asks)
    else:
        messages = plain_messages(asks)
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **options)
    except Exception as exc:  # jinja2's errors, the template's raise_exception, a value it cannot take
        raise PermanentEngineError(f"messages: the model's chat template cannot render this request: {exc}") from exc
    return list(tokenizer.encode(text, add_special_tokens=False))


def template_options(tokenizer: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request's ``chat_template_kwargs`` as the template gets them (this module's docstring): a caller's
    template and apply_chat_template's own arguments refused, keys the template does not read dropped."""
    template = kwargs.get("chat_template")
    if template is not None and template not in TRUSTED_TEMPLATES:
        raise PermanentEngineError(UNTRUSTED_TEMPLATE)
    controls = sorted(TEMPLATE_CONTROLS & kwargs.keys())
    if controls:
        raise PermanentEngineError(
            f"chat_template_kwargs may not set {', '.join(controls)}: the engine sets them itself; omit them"
        )
    read = template_variables(template or getattr(tokenizer, "chat_template", None) or "")
    options = {key: value for key, value in kwargs.items() if key in read}
    if template is not None:
        options["chat_template"] = template
    return options


@lru_cache(maxsize=8)
def template_variables(template: str) -> frozenset[str]:
    """The names a Jinja template reads from its context (those it does not set itself)."""
    import jinja2
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except jinja2.TemplateSyntaxError:
        return frozenset()


def prompt_chars(asks: Asks) -> int:
    """What the template is given, in characters: the messages' text, the tools' signatures, the template's
    arguments. Cheap: nothing is rendered or tokenised."""
    chars = sum(len(text_of(m.get("content"))) for m in asks.messages)
    chars += sum(len(json.dumps(c)) for m in asks.messages for c in m.get("tool_calls") or [])
    chars += sum(len(json.dumps(f.signature())) for f in asks.tools)
    return chars + len(json.dumps(asks.chat_template_kwargs))


def check_prompt_chars(asks: Asks, *, longest_token_chars: int, max_model_len: int) -> None:
    """Refuse a prompt that cannot fit in the context whatever its tokens (this module's docstring), before it is
    templated and tokenised."""
    room = max(0, max_model_len - asks.max_tokens)
    chars = prompt_chars(asks)
    if chars > longest_token_chars * room:
        raise PromptTooLongError(
            f"this model's maximum context length is {max_model_len} tokens, and the messages alone hold {chars} "
            f"characters: at least {chars // longest_token_chars} tokens, with {asks.max_tokens} in max_tokens: "
            "shorten the messages or lower max_tokens"
        )


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters any one token of ``tokenizer`` stands for (at least 1)."""
    ids = sorted(tokenizer.get_vocab().values())
    return max([1, *(len(text) for text in tokenizer.batch_decode([[i] for i in ids]))])


def check_context(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse a request whose prompt plus completion cannot fit in the context, as vLLM's OpenAI server does."""
    if prompt_tokens + max_tokens > max_model_len:
        raise PromptTooLongError(
            f"this model's maximum context length is {max_model_len} tokens, but the request needs "
            f"{prompt_tokens + max_tokens} ({prompt_tokens} in the messages, {max_tokens} in max_tokens): "
            "shorten the messages or lower max_tokens"
        )
