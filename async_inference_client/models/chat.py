"""A job's result: an OpenAI ``chat.completion`` (a batch line's body is the same object), with the job's id."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from async_inference_client.models.base import TolerantModel


class Usage(TolerantModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    job_id: str | None = None  # on a job's result object; a batch line's body has none
