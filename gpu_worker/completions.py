"""One engine ``Generation`` as OpenAI's ``chat.completion``: the body of a job's result object and of a batch line's
response. The job's result and the batch line's body are built here and nowhere else.

Each engine choice becomes a ``choices[i]``: its text as ``message.content`` (null when the model only called tools),
its calls as ``message.tool_calls`` (or, for a request that used the legacy ``functions``, the first as
``message.function_call``, as OpenAI answers those), ``finish_reason`` as the engine gave it, and its token logprobs
under ``logprobs.content`` (null when the request did not ask for them).
"""

from __future__ import annotations

import time

from async_inference.schemas import (
    AssistantMessage,
    ChatCompletion,
    Choice,
    ChoiceLogprobs,
    MessageFunctionCall,
    MessageToolCall,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from gpu_worker.engines.base import Completion, Generation


def usage_of(generation: Generation) -> Usage:
    return Usage(
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        total_tokens=generation.prompt_tokens + generation.completion_tokens,
    )


def message_of(completion: Completion) -> AssistantMessage:
    calls = [
        MessageToolCall(id=c.id, function=MessageFunctionCall(name=c.name, arguments=c.arguments))
        for c in completion.tool_calls
    ]
    if completion.finish_reason == "function_call" and calls:
        return AssistantMessage(content=completion.text or None, function_call=calls[0].function)
    return AssistantMessage(
        content=completion.text if completion.text or not calls else None,
        refusal=completion.refusal,
        tool_calls=calls or None,
    )


def logprobs_of(completion: Completion) -> ChoiceLogprobs | None:
    if completion.logprobs is None:
        return None
    return ChoiceLogprobs(
        content=[
            TokenLogprob(
                token=t.token,
                logprob=t.logprob,
                bytes=t.bytes,
                top_logprobs=[TopLogprob(token=a.token, logprob=a.logprob, bytes=a.bytes) for a in t.top_logprobs],
            )
            for t in completion.logprobs
        ]
    )


def chat_completion(
    generation: Generation, *, completion_id: str, model: str, job_id: str | None = None
) -> ChatCompletion:
    """``completion_id`` is ``chatcmpl-...``; ``job_id`` is set on a job's result object (a batch line's body has
    none)."""
    return ChatCompletion(
        id=completion_id,
        created=int(time.time()),
        model=model,
        choices=[
            Choice(index=i, message=message_of(c), finish_reason=c.finish_reason, logprobs=logprobs_of(c))
            for i, c in enumerate(generation.choices)
        ],
        usage=usage_of(generation),
        system_fingerprint=generation.system_fingerprint,
        job_id=job_id,
    )
