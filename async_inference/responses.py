"""OpenAI's Responses API in background mode, as a job: the two conversions between a response and its job.

A background response is a job underneath (docs/design/responses.md): ``to_chat_request`` turns a ``POST
/v1/responses`` body into the chat.completions request the job runs, and ``to_response`` turns the job, the original
body and the job's chat.completion result into the Response object that ``GET /v1/responses/{id}`` answers. A
responses line of a batch runs as the same chat request and is answered with the same Response, through the same two
functions (``gpu_worker.answers``). The wire models are ``async_inference.schemas.responses``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from async_inference.jobs import JobStatus
from async_inference.schemas.chat import ChatCompletionRequest
from async_inference.schemas.records import Job
from async_inference.schemas.responses import (
    FormatJSONObject,
    FormatJSONSchema,
    FunctionCallItem,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputMessage,
    InputText,
    Item,
    OutputText,
    ReasoningItem,
    Refusal,
    Response,
    ResponseCreate,
    ResponseError,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputRefusal,
    ResponseOutputText,
    ResponseStatus,
    ResponseUsage,
    ToolChoiceFunction,
)
from async_inference_client.models.chat import ChatCompletion

RESPONSE_ID_PATTERN = r"^resp_[0-9a-f]{32}$"
_RESPONSE_ID_RE = re.compile(RESPONSE_ID_PATTERN)
# A response's job is namespaced apart from /v1/jobs under one Idempotency-Key: the same key sent to both APIs makes
# two jobs, not a response that replays a plain job.
IDEMPOTENCY_NAMESPACE = "responses\x00"


def response_id_of(job_id: str) -> str:
    """The response id of a response's job: the same 32 hex digits, ``resp_`` instead of ``job_``."""
    return "resp_" + job_id.removeprefix("job_")


def job_id_of(response_id: str) -> str:
    """The job id under a response id (``response_id_of`` reversed); ValueError for a malformed id."""
    if not _RESPONSE_ID_RE.match(response_id):
        raise ValueError(f"{response_id!r} is not a response id (resp_ and 32 hex digits)")
    return "job_" + response_id.removeprefix("resp_")


# --- Request conversion: Responses -> chat.completions ---------------------------------------------------------------


def chat_messages(request: ResponseCreate, items: Sequence[Item] | None = None) -> list[dict[str, Any]]:
    """The chat messages of a Responses request: ``instructions`` as the system message, then the input items
    (``items``: the conversation to run instead, its history and input, async_inference.conversation); consecutive
    function calls become one assistant message's ``tool_calls``, a call's output a ``tool`` message."""
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    for item in request.items() if items is None else items:
        if isinstance(item, ReasoningItem):
            continue  # see ReasoningItem
        if isinstance(item, FunctionCallItem):
            function = {"name": item.name, "arguments": item.arguments}
            call = {"id": item.call_id, "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
        elif item.role == "assistant":
            messages.append({"role": "assistant", "content": item.text})
        else:
            messages.append({"role": item.role, "content": item.text})
    return messages


def to_chat_request(request: ResponseCreate, items: Sequence[Item] | None = None) -> ChatCompletionRequest:
    """The chat.completions request a response's job runs (``items``: as for ``chat_messages``)."""
    body: dict[str, Any] = {"model": request.model, "messages": chat_messages(request, items)}
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    for name in (
        "stream",
        "temperature",
        "top_p",
        "parallel_tool_calls",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "service_tier",
    ):
        if getattr(request, name) is not None:
            body[name] = getattr(request, name)
    text = request.text
    if text is not None and text.verbosity is not None:
        body["verbosity"] = text.verbosity
    if text is not None and isinstance(text.format, FormatJSONObject):
        body["response_format"] = {"type": "json_object"}
    elif text is not None and isinstance(text.format, FormatJSONSchema):
        schema = {"name": text.format.name, "schema": text.format.schema_}
        schema |= {k: v for k in ("description", "strict") if (v := getattr(text.format, k)) is not None}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if request.tools:
        body["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in request.tools
        ]
    if isinstance(request.tool_choice, ToolChoiceFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": request.tool_choice.name}}
    elif request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    if request.reasoning is not None and request.reasoning.effort is not None:
        body["reasoning_effort"] = request.reasoning.effort
    return ChatCompletionRequest.model_validate(body)


# --- Result conversion: job + chat.completion -> Response ------------------------------------------------------------


_STATUS: dict[JobStatus, ResponseStatus] = {
    JobStatus.AWAITING_UPLOAD: "queued",
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
    JobStatus.EXPIRED: "failed",
}


def _seconds(moment: dt.datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def output_items(
    response_id: str, result: ChatCompletion
) -> tuple[list[ResponseOutputMessage | ResponseFunctionToolCall], bool]:
    """The output items of a chat.completion (its first choice), and whether it was cut at the token limit: a
    ``message`` item with the text (and a refusal), then one ``function_call`` item per tool call."""
    choice = result.choices[0]
    cut = choice.finish_reason == "length"
    message = choice.message
    suffix = response_id.removeprefix("resp_")
    items: list[ResponseOutputMessage | ResponseFunctionToolCall] = []
    parts: list[ResponseOutputText | ResponseOutputRefusal] = []
    if message.content is not None and (message.content or not message.tool_calls):
        parts.append(ResponseOutputText(text=message.content))
    if message.refusal is not None:
        parts.append(ResponseOutputRefusal(refusal=message.refusal))
    if parts or not message.tool_calls:
        parts = parts or [ResponseOutputText(text="")]
        items.append(
            ResponseOutputMessage(id=f"msg_{suffix}", status="incomplete" if cut else "completed", content=parts)
        )
    calls = [(call.id, call.function) for call in message.tool_calls or ()]
    for index, (call_id, function) in enumerate(calls):
        items.append(
            ResponseFunctionToolCall(
                id=f"fc_{suffix}_{index}", call_id=call_id, name=function.name, arguments=function.arguments
            )
        )
    return items, cut


@dataclass(frozen=True)
class ResponseRun:
    """What a Response says of the run that answers it: a background response's job (``of_job``), or a batch line's
    run, which has no job (``batch_line``)."""

    response_id: str
    status: JobStatus
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    error_code: str | None = None  # OpenAI's code of a failure that is the request's fault

    @classmethod
    def of_job(cls, job: Job) -> ResponseRun:
        return cls(
            response_id=response_id_of(job.job_id),
            status=job.status,
            created_at=job.created_at,
            finished_at=job.finished_at,
            metadata=job.metadata,
            error=job.error,
            error_code=job.error_code,
        )

    @classmethod
    def batch_line(cls, suffix: str, request: ResponseCreate) -> ResponseRun:
        """A batch line's response, answered now: ``resp_{suffix}``, created and completed at once, with the
        request's metadata."""
        now = dt.datetime.now(dt.UTC)
        return cls(
            response_id=f"resp_{suffix}",
            status=JobStatus.SUCCEEDED,
            created_at=now,
            finished_at=now,
            metadata=request.metadata or {},
        )


def to_response(run: Job | ResponseRun, request: ResponseCreate, result: ChatCompletion | None = None) -> Response:
    """The Response of ``run`` (a response's job, or a ``ResponseRun``): its status, the echo of the request's
    parameters, and once it has succeeded (``result`` given) its output and usage. The API answers with it for a
    job, the batch worker for a responses line."""
    if isinstance(run, Job):
        run = ResponseRun.of_job(run)
    response_id = run.response_id
    status = _STATUS[run.status]
    output: list[ResponseOutputMessage | ResponseFunctionToolCall] = []
    incomplete = None
    if result is not None:
        output, cut = output_items(response_id, result)
        if cut:
            status, incomplete = "incomplete", IncompleteDetails(reason="max_output_tokens")
    error = None
    if status == "failed":
        reason = run.error or "the response failed"
        if run.status is JobStatus.EXPIRED:
            reason = f"expired before a worker ran it: {reason}"
        error = ResponseError(code=run.error_code or "server_error", message=reason)
    usage = result.usage if result is not None else None  # a running job's tokens so far are not its usage
    text = request.text.model_dump(exclude_none=True, by_alias=True) if request.text else {}
    text.setdefault("format", {"type": "text"})
    tool_choice: str | dict[str, Any] = "auto"
    if isinstance(request.tool_choice, ToolChoiceFunction):
        tool_choice = request.tool_choice.model_dump()
    elif request.tool_choice is not None:
        tool_choice = request.tool_choice
    chat_defaults = ChatCompletionRequest.model_fields
    return Response(
        id=response_id,
        created_at=_seconds(run.created_at),
        status=status,
        background=request.background is True,
        completed_at=_seconds(run.finished_at) if status == "completed" else None,
        error=error,
        incomplete_details=incomplete,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        metadata=dict(run.metadata),
        model=request.model,
        output=output,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        previous_response_id=request.previous_response_id,
        reasoning=request.reasoning.model_dump(exclude={"generate_summary"}) if request.reasoning else None,
        temperature=request.temperature if request.temperature is not None else chat_defaults["temperature"].default,
        text=text,
        tool_choice=tool_choice,
        tools=[tool.model_dump() for tool in request.tools or ()],
        top_p=request.top_p if request.top_p is not None else chat_defaults["top_p"].default,
        truncation=request.truncation or "disabled",
        usage=ResponseUsage(
            input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, total_tokens=usage.total_tokens
        )
        if usage is not None
        else None,
        user=request.user,
    )


def _output_part(part: InputText | OutputText | Refusal) -> dict[str, Any]:
    if isinstance(part, Refusal):
        return part.model_dump(exclude_none=True)
    return {"type": "output_text", "text": part.text, "annotations": getattr(part, "annotations", None) or []}


def input_items(response_id: str, request: ResponseCreate) -> list[dict[str, Any]]:
    """The input as OpenAI lists it (oldest first): each item with an id (the one it was sent with, else one
    derived from the response id and its position), messages with their text as ``input_text`` parts."""
    suffix = response_id.removeprefix("resp_")
    listed = []
    for index, item in enumerate(request.items()):
        body = item.model_dump(exclude_none=True)
        if isinstance(item, InputMessage) and item.role == "assistant":
            # Listed as OpenAI lists an assistant turn: an output message, text parts output_text with annotations.
            parts = (
                item.content if isinstance(item.content, list) else [OutputText(type="output_text", text=item.content)]
            )
            body["content"] = [_output_part(part) for part in parts]
        elif isinstance(item, InputMessage) and isinstance(item.content, str):
            body["content"] = [{"type": "input_text", "text": item.content}]
        prefix = {InputMessage: "msg", ReasoningItem: "rs"}.get(type(item), "fc")
        body.setdefault("id", f"{prefix}_{suffix}_{index}")
        body.setdefault("status", "completed")
        listed.append(body)
    return listed
