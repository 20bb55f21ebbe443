"""OpenAI's Responses API in background mode, as a job: the wire models and the two conversions.

A background response is a job underneath (docs/design/responses.md): ``to_chat_request`` turns a ``POST
/v1/responses`` body into the chat.completions request the job runs, and ``to_response`` turns the job, the original
body and the job's chat.completion result into the Response object that ``GET /v1/responses/{id}`` answers. The
models are openai-python's own field for field (``openai.types.responses.response``, ``response_output_message``,
``response_function_tool_call``, ``response_usage``, ``response_item_list``), so the official SDK parses them.

What a request may hold is one of three kinds, as for chat (``async_inference.schemas``): honoured (converted into
the chat request), accepted without effect (``store: true``, ``user``, prompt caching hints, ``service_tier``,
``text.verbosity``), and refused with a 400 naming the field: what needs state this service does not keep
(``conversation``, ``prompt``), OpenAI-hosted tools, and what would change the
answer in a way the conversion cannot carry.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationInfo,
    model_validator,
)

from async_inference import settings
from async_inference.jobs import JobStatus
from async_inference.schemas import (
    _HOSTED_TOOLS,
    TAG_MARK,
    TEXT_ONLY,
    ChatCompletion,
    ChatCompletionRequest,
    FunctionName,
    Job,
    JSONSchemaObject,
    MetadataKey,
    MetadataValue,
    PromptCacheOptions,
    StreamOptions,
    TokenLimit,
    _by_type,
    _field_error,
    _refuse,
    _shape,
    _Strict,
)

RESPONSE_ID_PATTERN = r"^resp_[0-9a-f]{32}$"
_RESPONSE_ID_RE = re.compile(RESPONSE_ID_PATTERN)
# A response's job is namespaced apart from /v1/jobs under one Idempotency-Key: the same key sent to both APIs makes
# two jobs, not a response that replays a plain job.
IDEMPOTENCY_NAMESPACE = "responses\x00"
# The validation context of a batch line's body (async_inference.endpoints): a line runs without the tenant's stored
# responses, so it cannot continue one.
BATCH_LINE = "batch_line"


def response_id_of(job_id: str) -> str:
    """The response id of a response's job: the same 32 hex digits, ``resp_`` instead of ``job_``."""
    return "resp_" + job_id.removeprefix("job_")


def job_id_of(response_id: str) -> str:
    """The job id under a response id (``response_id_of`` reversed); ValueError for a malformed id."""
    if not _RESPONSE_ID_RE.match(response_id):
        raise ValueError(f"{response_id!r} is not a response id (resp_ and 32 hex digits)")
    return "job_" + response_id.removeprefix("resp_")


# --- The request: POST /v1/responses --------------------------------------------------------------------------------
# Field for field openai-python ``types/responses/response_create_params.py`` (the parts a background job runs).

Text = Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)]
ItemId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ItemStatus = Literal["in_progress", "completed", "incomplete"]

_NON_TEXT_INPUTS = {"input_image": "an image", "input_file": "a file", "input_audio": "audio"}


def _text_only_input(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _NON_TEXT_INPUTS:
        raise _refuse(
            "unsupported_content",
            f"this {kind!r} part ({_NON_TEXT_INPUTS[kind]}) cannot be read: {TEXT_ONLY}; send input_text parts only",
        )
    return value


class InputText(_Strict):
    type: Literal["input_text"]
    text: Text
    prompt_cache_breakpoint: dict[str, Any] | None = None  # a caching hint: no effect here


class OutputText(_Strict):
    """An assistant turn's text, sent back in the input as a previous response's output carried it."""

    type: Literal["output_text"]
    text: Text
    annotations: list[dict[str, Any]] | None = None  # they say nothing to the model
    logprobs: list[dict[str, Any]] | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: Text


InputPart = Annotated[
    _by_type(InputText, OutputText, Refusal, field="a content part"), BeforeValidator(_text_only_input)
]
InputContent = Annotated[
    Annotated[Text, Tag(TAG_MARK + "str")]
    | Annotated[list[InputPart], Field(min_length=1, max_length=settings.MAX_CONTENT_PARTS), Tag(TAG_MARK + "list")],
    Discriminator(
        _shape,
        custom_error_type="content_type",
        custom_error_message="content must be a string or a list of content parts",
    ),
]


class InputMessage(_Strict):
    """A message of the input (OpenAI's EasyInputMessage and input message item: ``type`` may be left out)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: InputContent
    id: ItemId | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCallItem(_Strict):
    """A function call the model made in an earlier turn, sent back with the history."""

    type: Literal["function_call"]
    call_id: ItemId
    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    arguments: Text
    id: ItemId | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(_Strict):
    """The result of a function call, which the caller ran."""

    type: Literal["function_call_output"]
    call_id: ItemId
    output: Text | list[InputText]
    id: ItemId | None = None
    status: ItemStatus | None = None

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(_Strict):
    type: Literal["summary_text", "reasoning_text"]
    text: Text


class ReasoningItem(_Strict):
    """An earlier turn's reasoning, sent back with the history. Left out of the chat request: its encrypted content
    is readable by OpenAI's models only, and chat templates drop earlier turns' reasoning (vLLM's and OpenAI's own
    chat.completions take none)."""

    type: Literal["reasoning"]
    id: ItemId | None = None
    summary: list[ReasoningText] = Field(default_factory=list, max_length=settings.MAX_CONTENT_PARTS)
    content: list[ReasoningText] | None = Field(default=None, max_length=settings.MAX_CONTENT_PARTS)
    encrypted_content: Text | None = None
    status: ItemStatus | None = None


def _item_kind(value: Any) -> str | None:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)
    return TAG_MARK + kind if isinstance(kind, str) else None


def _known_item(value: Any) -> Any:
    kind = value.get("type", "message") if isinstance(value, dict) else None
    if kind == "item_reference":
        raise _refuse(
            "unsupported_item",
            "an item_reference refers to an item OpenAI stored; this service keeps no "
            "items to refer to: send the item itself",
        )
    if isinstance(kind, str) and kind not in ("message", "function_call", "function_call_output", "reasoning"):
        raise _refuse(
            "unsupported_item",
            f"a {kind!r} item cannot be run here: the input may hold message, "
            "function_call, function_call_output and reasoning items",
        )
    return value


Item = InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
InputItem = Annotated[
    Union[  # noqa: UP007 (a union of Annotated members, written as the schemas module writes its own)
        Annotated[InputMessage, Tag(TAG_MARK + "message")],
        Annotated[FunctionCallItem, Tag(TAG_MARK + "function_call")],
        Annotated[FunctionCallOutputItem, Tag(TAG_MARK + "function_call_output")],
        Annotated[ReasoningItem, Tag(TAG_MARK + "reasoning")],
    ],
    Discriminator(
        _item_kind,
        custom_error_type="invalid_type",
        custom_error_message="an input item needs a type among 'message', 'function_call', "
        "'function_call_output', 'reasoning'",
    ),
    BeforeValidator(_known_item),
]
Input = Annotated[
    Annotated[Text, Tag(TAG_MARK + "str")]
    | Annotated[list[InputItem], Field(min_length=1, max_length=settings.MAX_MESSAGES), Tag(TAG_MARK + "list")],
    Discriminator(
        _shape, custom_error_type="input_type", custom_error_message="input must be a string or a list of input items"
    ),
]


class FunctionTool(_Strict):
    """A function tool as the Responses API declares it: flat, no ``function`` wrapper."""

    type: Literal["function"]
    name: FunctionName
    description: Text | None = None
    parameters: JSONSchemaObject | None = None
    strict: bool | None = None


def _function_tool(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _HOSTED_TOOLS or (isinstance(kind, str) and kind.startswith(("web_search", "computer_use"))):
        raise _refuse(
            "unsupported_tool",
            f"{kind!r} is a tool OpenAI runs on its own servers; this deployment runs "
            "none: declare a function tool and run it yourself",
        )
    if kind is not None and kind != "function":
        raise _refuse(
            "unsupported_tool",
            f"{kind!r} tools are not supported: declare a function tool whose parameters are a JSON schema",
        )
    return value


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: FunctionName


def _function_tool_choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(value, dict) and kind != "function":
        raise _refuse(
            "unsupported_tool_choice",
            f"tool_choice {kind!r} is not supported: send 'none', 'auto', "
            "'required' or {'type': 'function', 'name': ...}",
        )
    return value


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag(TAG_MARK + "str")]
    | Annotated[ToolChoiceFunction, BeforeValidator(_function_tool_choice), Tag(TAG_MARK + "object")],
    Discriminator(
        _shape,
        custom_error_type="tool_choice_type",
        custom_error_message="tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
    ),
]


class FormatText(_Strict):
    type: Literal["text"]


class FormatJSONObject(_Strict):
    type: Literal["json_object"]


class FormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    name: FunctionName
    schema_: JSONSchemaObject = Field(alias="schema")
    description: Text | None = None
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, serialize_by_alias=True, validate_by_name=False)


TextFormat = _by_type(FormatText, FormatJSONObject, FormatJSONSchema, field="text.format")


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # no effect on a model without it (as for chat)


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None  # as chat's reasoning_effort
    # A summary of reasoning items: a response here has none to summarize (no effect, as reasoning_effort for chat).
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name of summary


# ``include`` values that name data a response here never holds (no reasoning items, no hosted tool calls, no image
# inputs): asking for them adds nothing, as OpenAI's answer for a response without them. Output logprobs would be
# data the caller expects and does not get: refused.
Includable = Literal[
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
]


def _no_logprobs(value: Any) -> Any:
    if value == "message.output_text.logprobs":
        raise _refuse(
            "unsupported_parameter",
            "output logprobs are not returned by the Responses API here: use a "
            "chat.completions job (POST /v1/jobs) with logprobs: true",
        )
    return value


# Parameters OpenAI takes that a background job here cannot honour, and what to do instead: a 400 names them.
REFUSED = {
    "conversation": "this service keeps no conversation objects: continue a response with previous_response_id, or "
    "send the earlier turns in input",
    "prompt": "stored prompt templates live on OpenAI's servers: send the prompt's text in instructions and input",
    "max_tool_calls": "built-in tool calls are not run here, and a function call ends the response: omit "
    "max_tool_calls",
    "context_management": "context compaction is not supported: send the input to run, within the model's context",
    "moderation": "moderation is a service OpenAI runs on its own servers; this deployment has none: omit moderation",
    "top_logprobs": "output logprobs are not returned by the Responses API here: use a chat.completions job (POST "
    "/v1/jobs) with logprobs: true",
    "background_options": "completion windows are not supported: a background response runs as soon as a worker "
    "is free; omit background_options",
    "image": "this deployment serves a text-only model: omit image",
    "access_programs": "access programs are OpenAI's: omit access_programs",
}


ResponseEvent = Literal["response.completed", "response.failed", "response.cancelled", "response.incomplete"]


class ResponseWebhookSpec(_Strict):
    """Where a background response's end is told, signed as job webhooks are (Standard Webhooks, the tenant's
    secret): OpenAI's webhook event (``response.completed``, ``response.failed``, ``response.cancelled``,
    ``response.incomplete``) with the response's id."""

    url: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    events: list[ResponseEvent] = Field(
        default_factory=lambda: list(get_args(ResponseEvent)),
        min_length=1,
        description="The events to deliver. Default: all four.",
    )


class ResponseCreate(_Strict):
    """``POST /v1/responses``: what a background response here runs (the rest is refused by name)."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    input: Input
    instructions: Text | None = None
    background: bool | None = None
    # The answer as Responses events while the job decodes (docs/streaming.md); the job streams to its event log.
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    store: bool | None = None
    max_output_tokens: TokenLimit | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    text: TextConfig | None = None
    tools: list[Annotated[FunctionTool, BeforeValidator(_function_tool)]] | None = Field(
        default=None, max_length=settings.MAX_TOOLS
    )
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=settings.MAX_METADATA_KEYS)
    reasoning: Reasoning | None = None
    include: list[Annotated[Includable, BeforeValidator(_no_logprobs)]] | None = Field(default=None, max_length=16)
    # Conversation state (async_inference.conversation): the stored response this one continues, and what to do when
    # the history with the input cannot fit the model's context.
    previous_response_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    truncation: Literal["disabled", "auto"] | None = Field(
        default=None,
        description="'disabled' (OpenAI's default): an input over the model's context is a 400; 'auto': the oldest "
        "items of the conversation are dropped until it fits.",
    )
    # Accepted without effect, as for chat.
    user: Annotated[str, StringConstraints(max_length=256)] | None = None
    safety_identifier: Annotated[str, StringConstraints(max_length=64)] | None = None
    prompt_cache_key: Annotated[str, StringConstraints(max_length=1024)] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    # An extension (the SDK sends it as extra_body={"webhook": {...}}): OpenAI configures webhooks per project, this
    # service per request, as for jobs and batches. The response's end is POSTed there as OpenAI's response.* event.
    webhook: ResponseWebhookSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _refused_and_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, message in REFUSED.items():
            value = data.get(name)
            if value is not None and value is not False and value != []:
                raise _field_error(name, message)
        # An explicit null is the parameter left out, as OpenAI takes it; so are the refused ones sent empty.
        return {k: v for k, v in data.items() if v is not None and k not in REFUSED}

    @model_validator(mode="after")
    def _background_and_store(self) -> ResponseCreate:
        # Without background the request is held until its job ends (lambdas/api/openai_routes.py).
        if self.background is True and self.store is False:
            raise _field_error(
                "store",
                "a background response is stored until it is retrieved (as OpenAI requires "
                "store for background mode): omit store or send true",
            )
        if self.tool_choice is not None and not self.tools:
            raise _field_error("tool_choice", "tool_choice needs tools: declare the functions in tools")
        if isinstance(self.tool_choice, ToolChoiceFunction) and self.tool_choice.name not in {
            t.name for t in self.tools or ()
        }:
            raise _field_error(
                "tool_choice", f"names the function {self.tool_choice.name!r}, which is not among the declared tools"
            )
        return self

    @model_validator(mode="after")
    def _stateless_in_a_batch(self, info: ValidationInfo) -> ResponseCreate:
        if not (info.context or {}).get(BATCH_LINE):
            return self
        if self.previous_response_id is not None:
            raise _field_error(
                "previous_response_id",
                "a batch line cannot continue a stored response: send the earlier turns in input",
            )
        if self.truncation == "auto":
            raise _field_error("truncation", "a batch line's input is run whole: omit truncation or send 'disabled'")
        return self

    def items(self) -> list[Item]:
        """The input as a list of items (a string input is one user message)."""
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return list(self.input)


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


# --- The Response object: openai-python types/responses/response.py --------------------------------------------------


class ResponseOutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None


class ResponseOutputRefusal(BaseModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


class ResponseOutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[ResponseOutputText | ResponseOutputRefusal]


class ResponseFunctionToolCall(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus = "completed"


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"] | None = None


ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled", "incomplete"]


class Response(BaseModel):
    """A background response, as ``GET /v1/responses/{id}`` answers it. Absent values are sent as null, as OpenAI
    sends them."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool = True
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str
    output: list[ResponseOutputMessage | ResponseFunctionToolCall] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled", "auto"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputItemList(BaseModel):
    """``GET /v1/responses/{id}/input_items``: OpenAI's cursor page of the input items."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


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


def to_response(job: Job, request: ResponseCreate, result: ChatCompletion | None = None) -> Response:
    """The Response of a response's job: its status, the echo of the request's parameters, and once the job has
    succeeded (``result`` given) its output and usage."""
    response_id = response_id_of(job.job_id)
    status = _STATUS[job.status]
    output: list[ResponseOutputMessage | ResponseFunctionToolCall] = []
    incomplete = None
    if result is not None:
        output, cut = output_items(response_id, result)
        if cut:
            status, incomplete = "incomplete", IncompleteDetails(reason="max_output_tokens")
    error = None
    if status == "failed":
        reason = job.error or "the response failed"
        if job.status is JobStatus.EXPIRED:
            reason = f"expired before a worker ran it: {reason}"
        error = ResponseError(code=job.error_code or "server_error", message=reason)
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
        created_at=_seconds(job.created_at),
        status=status,
        background=request.background is True,
        completed_at=_seconds(job.finished_at) if status == "completed" else None,
        error=error,
        incomplete_details=incomplete,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        metadata=job.metadata,
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
