"""OpenAI's Responses API in background mode: the request (``POST /v1/responses``) and the Response object, with its
output items, usage and the input item list. The models are openai-python's own field for field
(``openai.types.responses.response``, ``response_output_message``, ``response_function_tool_call``,
``response_usage``, ``response_item_list``), so the official SDK parses them. The conversions between a response and
the chat request its job runs are ``async_inference.responses``.

What a request may hold is one of three kinds, as for chat (``async_inference.schemas.chat``): honoured (converted into
the chat request), accepted without effect (``store: true``, ``user``, prompt caching hints, ``service_tier``,
``text.verbosity``), and refused with a 400 naming the field: what needs state this service does not keep
(``conversation``, ``prompt``), OpenAI-hosted tools, and what would change the
answer in a way the conversion cannot carry.
"""

from __future__ import annotations

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
from async_inference.schemas.fields import (
    HOSTED_TOOLS,
    TAG_MARK,
    TEXT_ONLY,
    FunctionName,
    JSONSchemaObject,
    MetadataKey,
    MetadataValue,
    PromptCacheOptions,
    StreamOptions,
    Text,
    TokenLimit,
    by_type,
    field_error,
    refuse,
    shape,
    tool_choice,
)
from async_inference_client.models.base import StrictModel

# The validation context of a batch line's body (async_inference.endpoints): a line runs without the tenant's stored
# responses, so it cannot continue one.
BATCH_LINE = "batch_line"


# --- The request: POST /v1/responses --------------------------------------------------------------------------------
# Field for field openai-python ``types/responses/response_create_params.py`` (the parts a background job runs).


ItemId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ItemStatus = Literal["in_progress", "completed", "incomplete"]

_NON_TEXT_INPUTS = {"input_image": "an image", "input_file": "a file", "input_audio": "audio"}


def _text_only_input(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _NON_TEXT_INPUTS:
        raise refuse(
            "unsupported_content",
            f"this {kind!r} part ({_NON_TEXT_INPUTS[kind]}) cannot be read: {TEXT_ONLY}; send input_text parts only",
        )
    return value


class InputText(StrictModel):
    type: Literal["input_text"]
    text: Text
    prompt_cache_breakpoint: dict[str, Any] | None = None  # a caching hint: no effect here


class OutputText(StrictModel):
    """An assistant turn's text, sent back in the input as a previous response's output carried it."""

    type: Literal["output_text"]
    text: Text
    annotations: list[dict[str, Any]] | None = None  # they say nothing to the model
    logprobs: list[dict[str, Any]] | None = None


class Refusal(StrictModel):
    type: Literal["refusal"]
    refusal: Text


InputPart = Annotated[
    by_type(InputText, OutputText, Refusal, field="a content part"), BeforeValidator(_text_only_input)
]
InputContent = Annotated[
    Annotated[Text, Tag(TAG_MARK + "str")]
    | Annotated[list[InputPart], Field(min_length=1, max_length=settings.MAX_CONTENT_PARTS), Tag(TAG_MARK + "list")],
    Discriminator(
        shape,
        custom_error_type="content_type",
        custom_error_message="content must be a string or a list of content parts",
    ),
]


class InputMessage(StrictModel):
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


class FunctionCallItem(StrictModel):
    """A function call the model made in an earlier turn, sent back with the history."""

    type: Literal["function_call"]
    call_id: ItemId
    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    arguments: Text
    id: ItemId | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(StrictModel):
    """The result of a function call, which the caller ran."""

    type: Literal["function_call_output"]
    call_id: ItemId
    output: Text | list[InputText]
    id: ItemId | None = None
    status: ItemStatus | None = None

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(StrictModel):
    type: Literal["summary_text", "reasoning_text"]
    text: Text


class ReasoningItem(StrictModel):
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
        raise refuse(
            "unsupported_item",
            "an item_reference refers to an item OpenAI stored; this service keeps no "
            "items to refer to: send the item itself",
        )
    if isinstance(kind, str) and kind not in ("message", "function_call", "function_call_output", "reasoning"):
        raise refuse(
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
        shape, custom_error_type="input_type", custom_error_message="input must be a string or a list of input items"
    ),
]


class FunctionTool(StrictModel):
    """A function tool as the Responses API declares it: flat, no ``function`` wrapper."""

    type: Literal["function"]
    name: FunctionName
    description: Text | None = None
    parameters: JSONSchemaObject | None = None
    strict: bool | None = None


def _function_tool(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in HOSTED_TOOLS or (isinstance(kind, str) and kind.startswith(("web_search", "computer_use"))):
        raise refuse(
            "unsupported_tool",
            f"{kind!r} is a tool OpenAI runs on its own servers; this deployment runs "
            "none: declare a function tool and run it yourself",
        )
    if kind is not None and kind != "function":
        raise refuse(
            "unsupported_tool",
            f"{kind!r} tools are not supported: declare a function tool whose parameters are a JSON schema",
        )
    return value


class ToolChoiceFunction(StrictModel):
    type: Literal["function"]
    name: FunctionName


def _function_tool_choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if isinstance(value, dict) and kind != "function":
        raise refuse(
            "unsupported_tool_choice",
            f"tool_choice {kind!r} is not supported: send 'none', 'auto', "
            "'required' or {'type': 'function', 'name': ...}",
        )
    return value


ToolChoice = tool_choice(ToolChoiceFunction, _function_tool_choice, "{'type': 'function', 'name': ...}")


class FormatText(StrictModel):
    type: Literal["text"]


class FormatJSONObject(StrictModel):
    type: Literal["json_object"]


class FormatJSONSchema(StrictModel):
    type: Literal["json_schema"]
    name: FunctionName
    schema_: JSONSchemaObject = Field(alias="schema")
    description: Text | None = None
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", strict=True, serialize_by_alias=True, validate_by_name=False)


TextFormat = by_type(FormatText, FormatJSONObject, FormatJSONSchema, field="text.format")


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # no effect on a model without it (as for chat)


class Reasoning(StrictModel):
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
        raise refuse(
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


class ResponseWebhookSpec(StrictModel):
    """Where a background response's end is told, signed as job webhooks are (Standard Webhooks, the tenant's
    secret): OpenAI's webhook event (``response.completed``, ``response.failed``, ``response.cancelled``,
    ``response.incomplete``) with the response's id."""

    url: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    events: list[ResponseEvent] = Field(
        default_factory=lambda: list(get_args(ResponseEvent)),
        min_length=1,
        description="The events to deliver. Default: all four.",
    )


class ResponseCreate(StrictModel):
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
                raise field_error(name, message)
        # An explicit null is the parameter left out, as OpenAI takes it; so are the refused ones sent empty.
        return {k: v for k, v in data.items() if v is not None and k not in REFUSED}

    @model_validator(mode="after")
    def _background_and_store(self) -> ResponseCreate:
        # Without background the request is held until its job ends (lambdas/api/openai_routes.py).
        if self.background is True and self.store is False:
            raise field_error(
                "store",
                "a background response is stored until it is retrieved (as OpenAI requires "
                "store for background mode): omit store or send true",
            )
        if self.tool_choice is not None and not self.tools:
            raise field_error("tool_choice", "tool_choice needs tools: declare the functions in tools")
        if isinstance(self.tool_choice, ToolChoiceFunction) and self.tool_choice.name not in {
            t.name for t in self.tools or ()
        }:
            raise field_error(
                "tool_choice", f"names the function {self.tool_choice.name!r}, which is not among the declared tools"
            )
        return self

    @model_validator(mode="after")
    def _stateless_in_a_batch(self, info: ValidationInfo) -> ResponseCreate:
        if not (info.context or {}).get(BATCH_LINE):
            return self
        if self.previous_response_id is not None:
            raise field_error(
                "previous_response_id",
                "a batch line cannot continue a stored response: send the earlier turns in input",
            )
        if self.truncation == "auto":
            raise field_error("truncation", "a batch line's input is run whole: omit truncation or send 'disabled'")
        return self

    def items(self) -> list[Item]:
        """The input as a list of items (a string input is one user message)."""
        if isinstance(self.input, str):
            return [InputMessage(role="user", content=self.input)]
        return list(self.input)


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
