"""OpenAI's server-sent events, made from a job's log segments (``async_inference.streaming.follow``).

Three streams, each the one OpenAI sends for its endpoint, field for field (openai-python's
``types/chat/chat_completion_chunk.py``, ``types/completion.py``, ``types/responses/response_stream_event.py``; vLLM's
``serving_chat.py`` ``chat_completion_stream_generator``):

* ``chat_completion_chunks``: ``chat.completion.chunk`` objects: a first chunk per choice with the role, one per
  delta, the end's text, tool calls and refusal, a chunk with each choice's ``finish_reason``; with
  ``include_usage`` (``stream_options.include_usage``) every chunk has ``usage: null`` and a last chunk with no choices
  carries the usage; then ``data: [DONE]``.
* ``completion_chunks``: ``text_completion`` objects the same way (``/v1/completions``).
* ``response_events``: the Responses events (``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``, ... ,
  ``response.completed``), each with its ``sequence_number``. The events are a function of the segments alone, so a
  reader that starts again from the log makes the same events with the same numbers: ``starting_after=N`` skips
  those up to N, and a dropped stream resumes where it broke.

A run that did not succeed ends a chat or completions stream with OpenAI's error object (``data: {"error": ...}``,
which the SDK raises as ``APIError``) before ``[DONE]``, and a Responses stream with ``response.failed``; a stream
that cannot go on (``StreamInterrupted``) ends with an error the same way (``error`` for Responses).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from async_inference.schemas.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseUsage,
)
from async_inference.streaming.follow import StreamInterrupted
from async_inference.streaming.log import End, Segment

DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keep-alive\n\n"  # an SSE comment: clients skip it, the connection is not idle
MEDIA_TYPE = "text/event-stream"


def sse(data: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event: an optional ``event:`` line and one ``data:`` line of compact JSON."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _error(message: str, kind: str = "server_error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _end_error(end: End) -> dict[str, Any]:
    reason = end.error or f"the job ended {end.status}"
    if end.code is not None:  # the request's fault, as a held request's 400 says
        return _error(f"the job {end.status}: {reason}", kind="invalid_request_error", code=end.code)
    return _error(f"the job {end.status}: {reason}", code=end.status)


def _usage(end: End) -> dict[str, int]:
    return {
        "prompt_tokens": end.prompt_tokens,
        "completion_tokens": end.completion_tokens,
        "total_tokens": end.prompt_tokens + end.completion_tokens,
    }


# --- chat.completions ------------------------------------------------------------------------------------------------


def chat_completion_chunks(
    segments: Iterable[Segment],
    *,
    completion_id: str,
    model: str,
    created: int | None = None,
    n: int = 1,
    include_usage: bool = False,
) -> Iterator[str]:
    """The ``chat.completion.chunk`` stream of a job's segments, ``[DONE]`` last."""
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created if created is not None else int(time.time()),
        "model": model,
    }

    def chunk(
        choices: list[dict[str, Any]], usage: dict[str, int] | None = None, fingerprint: str | None = None
    ) -> str:
        data = {**base, "system_fingerprint": fingerprint, "choices": choices}
        if include_usage:
            data["usage"] = usage
        return sse(data)

    def choice(index: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    for index in range(n):  # vLLM's first chunk: the role, before any token
        yield chunk([choice(index, {"role": "assistant", "content": ""})])
    try:
        for segment in segments:
            if segment.empty:
                yield KEEPALIVE
            for delta in segment.deltas:
                if delta.text:
                    yield chunk([choice(delta.index, {"content": delta.text})])
            end = segment.end
            if end is None:
                continue
            if end.status != "succeeded":
                yield sse(_end_error(end))
                break
            for ending in end.choices:
                last: dict[str, Any] = {}
                if ending.text:
                    last["content"] = ending.text
                if ending.refusal:
                    last["refusal"] = ending.refusal
                if ending.tool_calls:
                    last["tool_calls"] = [
                        {
                            "index": i,
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        }
                        for i, c in enumerate(ending.tool_calls)
                    ]
                if last:
                    yield chunk([choice(ending.index, last)], fingerprint=end.system_fingerprint)
                yield chunk([choice(ending.index, {}, ending.finish_reason)], fingerprint=end.system_fingerprint)
            if include_usage:
                yield chunk([], usage=_usage(end), fingerprint=end.system_fingerprint)
    except StreamInterrupted as exc:
        yield sse(_error(str(exc)))
    yield DONE


# --- completions -----------------------------------------------------------------------------------------------------


def completion_chunks(
    segments: Iterable[Segment],
    *,
    completion_id: str,
    model: str,
    created: int | None = None,
    include_usage: bool = False,
) -> Iterator[str]:
    """The ``text_completion`` stream of a job's segments (``/v1/completions``), ``[DONE]`` last."""
    base = {
        "id": completion_id,
        "object": "text_completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        data = {**base, "choices": choices}
        if include_usage:
            data["usage"] = usage
        return sse(data)

    def choice(index: int, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    try:
        for segment in segments:
            if segment.empty:
                yield KEEPALIVE
            for delta in segment.deltas:
                if delta.text:
                    yield chunk([choice(delta.index, delta.text)])
            end = segment.end
            if end is None:
                continue
            if end.status != "succeeded":
                yield sse(_end_error(end))
                break
            for ending in end.choices:
                yield chunk([choice(ending.index, ending.text, ending.finish_reason)])
            if include_usage:
                yield chunk([], usage=_usage(end))
    except StreamInterrupted as exc:
        yield sse(_error(str(exc)))
    yield DONE


# --- Responses -------------------------------------------------------------------------------------------------------


def response_events(
    segments: Iterable[Segment],
    *,
    response: dict[str, Any],
    starting_after: int | None = None,
    clock: Callable[[], float] = time.time,
) -> Iterator[str]:
    """The Responses stream of a job's segments: ``response`` is the Response object as it stands (the route's
    ``to_response`` of the job), echoed in ``response.created`` and ``response.in_progress`` and completed from the
    log's end in the last event. Events numbered up to ``starting_after`` are not sent."""
    events = _ResponseEvents(response, clock)
    skip = -1 if starting_after is None else starting_after
    for event in events.of(segments):
        if event is None:
            yield KEEPALIVE
        elif event["sequence_number"] > skip:
            yield sse(event, event["type"])


class _ResponseEvents:
    """Numbers and builds the Responses events of one response (its first choice: a response has one)."""

    def __init__(self, response: dict[str, Any], clock: Callable[[], float]) -> None:
        self.response = response
        self.clock = clock
        suffix = response["id"].removeprefix("resp_")
        self.message_id = f"msg_{suffix}"  # the ids async_inference.responses.output_items gives the stored items
        self.call_id = f"fc_{suffix}_{{}}"
        self.sequence = 0
        self.text = ""
        self.message_open = False

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def of(self, segments: Iterable[Segment]) -> Iterator[dict[str, Any] | None]:
        """The events of ``segments`` in order; None for a keep-alive (it takes no number)."""
        yield self.event("response.created", response=self.response)
        yield self.event("response.in_progress", response={**self.response, "status": "in_progress"})
        try:
            for segment in segments:
                if segment.empty:
                    yield None
                for delta in segment.deltas:
                    if delta.index == 0 and delta.text:
                        yield from self.text_delta(delta.text)
                if segment.end is not None:
                    yield from self.ended(segment.end)
                    return
        except StreamInterrupted as exc:
            yield self.event("error", code="server_error", message=str(exc), param=None)

    def open_message(self) -> Iterator[dict[str, Any]]:
        self.message_open = True
        item = {"id": self.message_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        yield self.event("response.output_item.added", output_index=0, item=item)
        part = ResponseOutputText(text="").model_dump()
        yield self.event(
            "response.content_part.added", item_id=self.message_id, output_index=0, content_index=0, part=part
        )

    def text_delta(self, text: str) -> Iterator[dict[str, Any]]:
        if not self.message_open:
            yield from self.open_message()
        self.text += text
        yield self.event(
            "response.output_text.delta",
            item_id=self.message_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def ended(self, end: End) -> Iterator[dict[str, Any]]:
        if end.status != "succeeded":
            status = "cancelled" if end.status == "cancelled" else "failed"
            failed = {
                **self.response,
                "status": status,
                "error": {"code": end.code or "server_error", "message": end.error or f"the response {status}"},
            }
            yield self.event("response.failed", response=failed)
            return
        ending = next((c for c in end.choices if c.index == 0), None)
        cut = ending is not None and ending.finish_reason == "length"
        calls = ending.tool_calls if ending is not None else []
        output: list[dict[str, Any]] = []
        if ending is not None and ending.text:
            yield from self.text_delta(ending.text)
        refusal = ending.refusal if ending is not None else None
        if self.message_open or refusal is not None or not calls:
            yield from self.message_done(refusal, cut, output)
        for index, call in enumerate(calls):
            item_id = self.call_id.format(index)
            item = ResponseFunctionToolCall(id=item_id, call_id=call.id, name=call.name, arguments="").model_dump()
            output_index = len(output)
            yield self.event(
                "response.output_item.added", output_index=output_index, item={**item, "status": "in_progress"}
            )
            yield self.event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=output_index,
                delta=call.arguments,
            )
            yield self.event(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=output_index,
                arguments=call.arguments,
            )
            done = {**item, "arguments": call.arguments}
            output.append(done)
            yield self.event("response.output_item.done", output_index=output_index, item=done)
        usage = ResponseUsage(
            input_tokens=end.prompt_tokens,
            output_tokens=end.completion_tokens,
            total_tokens=end.prompt_tokens + end.completion_tokens,
        ).model_dump()
        final = {**self.response, "output": output, "usage": usage}
        if cut:
            final.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
            yield self.event("response.incomplete", response=final)
        else:
            final.update(status="completed", completed_at=int(self.clock()))
            yield self.event("response.completed", response=final)

    def message_done(self, refusal: str | None, cut: bool, output: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        if not self.message_open:
            yield from self.open_message()
        part = ResponseOutputText(text=self.text).model_dump()
        where = {"item_id": self.message_id, "output_index": 0}
        yield self.event("response.output_text.done", **where, content_index=0, text=self.text, logprobs=[])
        yield self.event("response.content_part.done", **where, content_index=0, part=part)
        parts: list[ResponseOutputText | ResponseOutputRefusal] = [ResponseOutputText(text=self.text)]
        if refusal is not None:
            parts.append(ResponseOutputRefusal(refusal=refusal))
        item = ResponseOutputMessage(
            id=self.message_id, status="incomplete" if cut else "completed", content=parts
        ).model_dump()
        output.append(item)
        yield self.event("response.output_item.done", output_index=0, item=item)
