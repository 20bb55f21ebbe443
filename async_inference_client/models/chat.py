"""A job's result: an OpenAI ``chat.completion`` (a batch line's body is the same object), with the job's id."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from async_inference_client.models.base import TolerantModel


class Usage(TolerantModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


# Field for field as openai-python types it (``openai.types.chat.chat_completion``, ``chat_completion_message``,
# ``chat_completion_message_tool_call``, ``chat_completion_token_logprob``): absent values are sent as null, as OpenAI
# sends them, so the SDK parses the body.


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


# The result's function and tool calls have names of their own: the service's request schema
# (async_inference.schemas) has a strict ``FunctionCall`` and ``ToolCall`` for the calls a client sends back in the
# conversation, and re-exports these beside them.
class MessageFunctionCall(BaseModel):
    """A function the model called: its name and its arguments, a JSON text as the model wrote it."""

    name: str
    arguments: str


class MessageToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: MessageFunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    function_call: MessageFunctionCall | None = None  # a request with the legacy ``functions``: its call, not tools


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter", "function_call"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None
    service_tier: str | None = None
    job_id: str | None = None  # on a job's result object; a batch line's body has none
