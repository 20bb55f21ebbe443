"""One engine ``Generation`` as OpenAI's ``chat.completion``: the body of a job's result object and of a batch line's
response. The job's result and the batch line's body are built here and nowhere else."""

from __future__ import annotations

import time

from async_inference.schemas import AssistantMessage, ChatCompletion, Choice, Usage
from gpu_worker.engines.base import Generation


def usage_of(generation: Generation) -> Usage:
    return Usage(prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                 total_tokens=generation.prompt_tokens + generation.completion_tokens)


def chat_completion(generation: Generation, *, completion_id: str, model: str,
                    job_id: str | None = None) -> ChatCompletion:
    """``completion_id`` is ``chatcmpl-...``; ``job_id`` is set on a job's result object (a batch line's body has
    none)."""
    return ChatCompletion(
        id=completion_id,
        created=int(time.time()),
        model=model,
        choices=[Choice(message=AssistantMessage(content=generation.text), finish_reason=generation.finish_reason)],
        usage=usage_of(generation),
        job_id=job_id,
    )
