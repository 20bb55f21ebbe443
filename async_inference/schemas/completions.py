"""``POST /v1/completions`` (the legacy text completion) as a batch line: the request, its conversion to the chat
request the engine runs, and OpenAI's ``text_completion`` answer (openai-python ``types/completion_create_params.py``
and ``completion.py``, field for field for what is accepted).

The engines run chat requests. A completions line runs on the chat engine as one ``user`` message whose chat template
is replaced by one that writes the message verbatim (``schemas.chat.RAW_PROMPT_TEMPLATE``, passed as transformers'
``apply_chat_template(chat_template=...)``): the model continues the raw prompt, no role markers added. vLLM refuses a
request's own chat template (its ``chat_template_kwargs`` may not name ``chat_template``), so on the vLLM engine a
completions line is refused by name until that engine routes it to vLLM's completion serving
(docs/design/embeddings.md).

Accepted and honoured: ``prompt`` (one string), ``max_tokens`` (OpenAI's default 16), ``temperature``, ``top_p``,
``n``, ``stop``, ``seed``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias``; ``user`` without effect. Refused
with a 400 naming the field: several prompts or token arrays in ``prompt`` (one line, one prompt; token ids are
OpenAI's tokenizer's), ``echo``, ``logprobs``, ``suffix``, ``best_of`` above 1. ``stream`` (and
``stream_options``) is carried to the chat request: the worker streams the job, the route sends its chunks.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, StringConstraints
from pydantic_core import PydanticCustomError

from async_inference import settings
from async_inference.schemas.chat import RAW_PROMPT_TEMPLATE, ChatCompletionRequest
from async_inference.schemas.fields import ChoiceCount, Penalty, StopSequence, StreamOptions, TokenId, TokenLimit
from async_inference_client.models.base import StrictModel
from async_inference_client.models.chat import ChatCompletion, Usage

COMPLETIONS_ENDPOINT = "/v1/completions"
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions (not chat's)


def _one_text_prompt(value: Any) -> Any:
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str):
            return value[0]
        if value and (isinstance(value[0], int) or isinstance(value[0], list)):
            raise PydanticCustomError(
                "token_array",
                "token arrays are not accepted: their ids come from OpenAI's tokenizer and mean other words to the "
                "model served here; send the text",
            )
        raise PydanticCustomError("one_prompt", "send one prompt per batch line (a string)")
    return value


def _refused(message: str, allowed: tuple[Any, ...] = (None, False)) -> Any:
    """A parameter refused with ``message`` unless it has one of the ``allowed`` values (those that change nothing)."""

    def refuse(value: Any) -> Any:
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise PydanticCustomError("unsupported_parameter", message)
        return value

    return BeforeValidator(refuse)


class CompletionRequest(StrictModel):
    """``POST /v1/completions``'s body, less what a job here cannot do (refused by name)."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    prompt: Annotated[
        Annotated[str, StringConstraints(min_length=1, max_length=settings.MAX_UPLOAD_BYTES)],
        BeforeValidator(_one_text_prompt),
    ]
    max_tokens: TokenLimit = DEFAULT_COMPLETION_MAX_TOKENS
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    n: ChoiceCount = 1
    stop: StopSequence | list[StopSequence] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[TokenId, Annotated[int, Field(ge=-100, le=100)]] | None = None
    user: Annotated[str, StringConstraints(max_length=256)] | None = None
    echo: Annotated[bool | None, _refused("echo is not supported: the prompt is yours already; omit echo")] = None
    logprobs: Annotated[
        int | None, _refused("logprobs is not supported on completions lines: use a chat.completions line", (None,))
    ] = None
    suffix: Annotated[str | None, _refused("suffix (insertion) is not supported: omit suffix", (None,))] = None
    best_of: Annotated[int | None, _refused("best_of is not supported: use n", (None, 1))] = None
    stream: bool | None = None  # the route streams text_completion chunks as the job decodes (docs/streaming.md)
    stream_options: StreamOptions | None = None

    def to_chat(self) -> ChatCompletionRequest:
        """The chat request the engine runs: the prompt as the one message, written out verbatim."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "chat_template_kwargs": {"chat_template": RAW_PROMPT_TEMPLATE},
        }
        for name in ("max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
                     "frequency_penalty", "logit_bias", "user", "stream", "stream_options"):  # fmt: skip
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return ChatCompletionRequest.model_validate(body)


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: None = None
    finish_reason: Literal["stop", "length", "content_filter"]


class TextCompletion(BaseModel):
    """OpenAI's ``Completion`` (``object: text_completion``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None


def text_completion(completion: ChatCompletion, *, completion_id: str) -> TextCompletion:
    """The chat.completion the engine's answer became, as a text completion."""
    return TextCompletion(
        id=completion_id,
        created=int(time.time()),
        model=completion.model,
        choices=[
            CompletionChoice(
                text=choice.message.content or "",
                index=choice.index,
                finish_reason="length" if choice.finish_reason == "length" else "stop",
            )
            for choice in completion.choices
        ],
        usage=completion.usage,
        system_fingerprint=completion.system_fingerprint,
    )
