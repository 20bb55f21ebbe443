"""The wire schemas: what clients send, what travels on the queue, what is stored and what subscribers receive.

Every producer and consumer validates with these models. Each message that leaves a process carries
``schema_version`` so that a consumer can tell an old message from a new one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from async_inference import settings
from async_inference.embeddings import EMBEDDINGS_ENDPOINT, EmbeddingList, EmbeddingRequest
from async_inference.jobs import JOB_ID_PATTERN, JobStatus
from async_inference.limits import check_template_kwargs
from async_inference.schema_patterns import unsupported_patterns

# The wire objects a client reads are defined in the client package and imported here: the API answers with the very
# models the SDK parses. What only the service validates or stores (requests, claim checks, records) is defined below.
from async_inference_client.models.base import SCHEMA_VERSION, StrictModel, TolerantModel
from async_inference_client.models.chat import (  # noqa: F401 (re-exported: the service imports them from here)
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
from async_inference_client.models.jobs import (  # noqa: F401 (re-exported: the service imports them from here)
    EVENT_STATUS,
    ErrorBody,
    ErrorDetail,
    ErrorResponse,
    JobEvent,
    JobEventType,
    JobList,
    JobPriority,
    JobProgress,
    JobView,
    PresignedUpload,
    PresignedUrl,
    Subscription,
    WebhookAttempt,
    WebhookState,
)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


_Strict = StrictModel  # client input
_Internal = TolerantModel  # messages between our own components


MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=settings.MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, StringConstraints(max_length=settings.MAX_METADATA_VALUE_CHARS)]


# --- The request: an OpenAI chat.completions body ------------------------------------------------------------------
#
# Field for field OpenAI's ``POST /v1/chat/completions`` (openai-python ``types/chat/completion_create_params.py``):
# attribute name == wire name, OpenAI's documented ranges. Three kinds of parameter:
# - honoured: they change the answer, and the engines apply them;
# - accepted without effect: they change nothing a self-hosted text model does (``user``, ``store``, ``metadata``,
#   ``service_tier``, prompt caching hints, ``stream_options.include_obfuscation``, ``reasoning_effort`` and
#   ``verbosity`` for a model without them, ``prediction``, a latency hint whose answer is the same);
# - refused with a 400 that names the field and says what to do instead: what a text-only job cannot do (image,
#   audio and file inputs, audio output, OpenAI-hosted tools and moderation).
# An explicit null means "omitted", as OpenAI takes it, for every optional top-level parameter.


def _refuse(code: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(code, message)


TEXT_ONLY = "this deployment serves a text-only model"


class PromptCacheBreakpoint(_Strict):
    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)]
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None  # a caching hint: no effect here


class RefusalPart(_Strict):
    """An assistant message's refusal, sent back in the conversation history."""

    type: Literal["refusal"]
    refusal: Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)]


_NON_TEXT_PARTS = {
    "image_url": "an image",
    "input_audio": "audio",
    "file": "a file",
    "input_image": "an image",
    "input_file": "a file",
    "video_url": "a video",
    "audio_url": "audio",
}


def _text_only_part(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _NON_TEXT_PARTS:
        raise _refuse(
            "unsupported_content",
            f"this {kind!r} part ({_NON_TEXT_PARTS[kind]}) cannot be read: "
            f"{TEXT_ONLY}; send text parts only (describe or transcribe the input as text)",
        )
    return value


# Unions pick their branch with a callable discriminator, so that an error is the chosen branch's (``content.1.text:
# Field required``), not one error per branch. Its tags start with TAG_MARK; error_location() leaves them out.
TAG_MARK = "~"


def _by_type(*members: type[BaseModel], field: str) -> Any:
    """A union of models told apart by their ``type``: a missing or unknown type is one error that lists the types."""
    types = [m.model_fields["type"].annotation.__args__[0] for m in members]  # type: ignore[union-attr]

    def kind(value: Any) -> str | None:
        found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        return TAG_MARK + found if isinstance(found, str) else None

    return Annotated[
        Union[tuple(Annotated[m, Tag(TAG_MARK + t)] for m, t in zip(members, types, strict=False))],  # noqa: UP007
        Discriminator(
            kind,
            custom_error_type="invalid_type",
            custom_error_message=f"{field} needs a type among " + ", ".join(map(repr, types)),
        ),
    ]


ContentPart = Annotated[_by_type(TextPart, RefusalPart, field="a content part"), BeforeValidator(_text_only_part)]


def _shape(value: Any) -> str | None:
    """The tag of a value that is a string, a list or an object (a dict, or a model when serializing)."""
    if isinstance(value, str):
        return TAG_MARK + "str"
    if isinstance(value, list):
        return TAG_MARK + "list"
    return TAG_MARK + "object" if isinstance(value, (dict, BaseModel)) else None


# A string, or a list of parts.
Content = Annotated[
    Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES), Tag(TAG_MARK + "str")]
    | Annotated[list[ContentPart], Field(max_length=settings.MAX_CONTENT_PARTS), Tag(TAG_MARK + "list")],
    Discriminator(
        _shape,
        custom_error_type="content_type",
        custom_error_message="content must be a string or a list of content parts",
    ),
]

FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
MessageName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class FunctionCall(_Strict):
    """A function the assistant called: its name and its arguments, a JSON text (as the model wrote it)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    arguments: Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)]


def _function_tool_call(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") not in (None, "function"):
        raise _refuse(
            "unsupported_tool_call",
            f"a {value.get('type')!r} tool call: only function tool calls are "
            "supported (the request's tools are function tools)",
        )
    return value


class ToolCall(_Strict):
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    type: Literal["function"]
    function: FunctionCall


def _no_audio(value: Any) -> Any:
    if value is not None:
        raise _refuse(
            "unsupported_parameter", f"audio cannot be referred to: {TEXT_ONLY}; send the assistant's words as content"
        )
    return value


MessageRole = Literal["developer", "system", "user", "assistant", "tool", "function"]


class ChatMessage(_Strict):
    """One message of the conversation, any role (OpenAI's message params in one model; the rules that differ by role
    are checked after). ``function`` is the legacy role of a function's result, the older ``tool``."""

    role: MessageRole
    content: Content | None = None
    name: MessageName | None = None
    tool_calls: list[Annotated[ToolCall, BeforeValidator(_function_tool_call)]] | None = Field(
        default=None, max_length=settings.MAX_TOOLS
    )
    tool_call_id: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    function_call: FunctionCall | None = None
    refusal: Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)] | None = None
    # An assistant message as a response carried it (url citations), sent back with the history: it says nothing to
    # the model, as OpenAI takes it.
    annotations: list[dict[str, Any]] | None = None
    audio: Annotated[None, BeforeValidator(_no_audio)] = None

    @model_validator(mode="after")
    def _role_rules(self) -> ChatMessage:
        role = self.role
        if role == "assistant":
            if self.content is None and not self.tool_calls and self.function_call is None:
                raise ValueError("an assistant message needs content, tool_calls or function_call")
        elif self.content is None and role != "function":
            raise ValueError(f"content is required for a {role!r} message")
        for name in ("tool_calls", "function_call", "refusal", "annotations"):
            if role != "assistant" and getattr(self, name) is not None:
                raise ValueError(f"{name} is only allowed on an assistant message, not on a {role!r} message")
        if role == "tool" and self.tool_call_id is None:
            raise ValueError("tool_call_id is required for a 'tool' message: the id of the tool call it answers")
        if role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"tool_call_id is only allowed on a 'tool' message, not on a {role!r} message")
        if role == "function" and self.name is None:
            raise ValueError("name is required for a 'function' message: the function whose result it is")
        if role != "assistant" and isinstance(self.content, list) and any(p.type == "refusal" for p in self.content):
            raise ValueError(f"refusal parts are only allowed in an assistant message, not in a {role!r} message")
        return self

    @property
    def text(self) -> str:
        """The content as one text: a list of parts joined (text and refusal parts), '' for no content."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)


def _patterns_the_grammar_takes(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema the engines compile into a grammar: a ``pattern`` the grammar library cannot honour is refused here,
    named by its path in the schema, rather than failing the job later (``async_inference.schema_patterns``)."""
    for path, why in unsupported_patterns(schema):
        raise _field_error(path, f"{why} (a limit of this deployment's structured outputs)")
    return schema


JSONSchemaObject = Annotated[dict[str, Any], AfterValidator(_patterns_the_grammar_takes)]


class LegacyFunction(_Strict):
    """A function of the legacy ``functions`` parameter."""

    name: FunctionName
    description: Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)] | None = None
    parameters: JSONSchemaObject | None = None


class FunctionDefinition(LegacyFunction):
    strict: bool | None = None


_HOSTED_TOOLS = {
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "mcp",
    "local_shell",
    "retrieval",
}


def _function_tool(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in _HOSTED_TOOLS:
        raise _refuse(
            "unsupported_tool",
            f"{kind!r} is a tool OpenAI runs on its own servers; this deployment runs "
            "none: declare a function tool and run it yourself",
        )
    if kind == "custom":
        raise _refuse(
            "unsupported_tool",
            "custom (free-form text or grammar) tools are not supported: declare a "
            "function tool whose parameters are a JSON schema",
        )
    return value


class FunctionTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    """``tool_choice`` naming the function the model must call."""

    type: Literal["function"]
    function: NamedFunction


def _named_tool_choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "allowed_tools":
        raise _refuse(
            "unsupported_tool_choice",
            "allowed_tools is not supported: send only the allowed tools in "
            "tools, with tool_choice 'auto' or 'required'",
        )
    if kind == "custom":
        raise _refuse("unsupported_tool_choice", "custom tools are not supported: name a function tool")
    return value


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag(TAG_MARK + "str")]
    | Annotated[NamedToolChoice, BeforeValidator(_named_tool_choice), Tag(TAG_MARK + "object")],
    Discriminator(
        _shape,
        custom_error_type="tool_choice_type",
        custom_error_message="tool_choice must be 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}",
    ),
]
FunctionCallChoice = Annotated[
    Annotated[Literal["none", "auto"], Tag(TAG_MARK + "str")] | Annotated[NamedFunction, Tag(TAG_MARK + "object")],
    Discriminator(
        _shape,
        custom_error_type="function_call_type",
        custom_error_message="function_call must be 'none', 'auto' or {'name': ...}",
    ),
]


class JSONSchemaFormat(_Strict):
    name: FunctionName
    description: str | None = None
    # ``schema`` is the wire name; the attribute would shadow BaseModel.schema (as in openai-python's own model).
    schema_: JSONSchemaObject | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=False)


class ResponseFormatText(_Strict):
    type: Literal["text"]


class ResponseFormatJSONObject(_Strict):
    type: Literal["json_object"]


class ResponseFormatJSONSchema(_Strict):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = _by_type(
    ResponseFormatText, ResponseFormatJSONObject, ResponseFormatJSONSchema, field="response_format"
)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class PredictedOutput(_Strict):
    type: Literal["content"]
    content: Content


class PromptCacheOptions(_Strict):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


def _deployment_limit(limit: int, message: str) -> Any:
    """At most ``limit``, a limit of this deployment rather than of OpenAI's API: the error says so and what to do.
    The JSON Schema says ``maximum`` as a ``le`` would."""

    def check(value: int) -> int:
        if value > limit:
            raise _refuse("deployment_limit", f"{value} is more than {message}")
        return value

    return [AfterValidator(check), Field(json_schema_extra={"maximum": limit})]


TokenLimit = Annotated[
    int,
    Field(ge=1),
    *_deployment_limit(
        settings.MAX_TOKENS_LIMIT,
        f"this deployment generates in one choice ({settings.MAX_TOKENS_LIMIT} tokens): ask "
        f"for at most {settings.MAX_TOKENS_LIMIT}",
    ),
]
ChoiceCount = Annotated[
    int,
    Field(ge=1),
    *_deployment_limit(
        settings.MAX_CHOICES,
        f"the {settings.MAX_CHOICES} choices this deployment generates for one request: send several requests for more",
    ),
]
StopSequence = Annotated[str, StringConstraints(min_length=1, max_length=256)]
TokenId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


def _refused_parameter(message: str) -> Any:
    """A parameter OpenAI takes that this deployment refuses unless null: the 400's message is the documented one."""

    def check(value: Any) -> Any:
        if value is not None:
            raise _refuse("unsupported_parameter", message)
        return value

    return [BeforeValidator(check), Field(description=f"Refused (400) unless null: {message}.")]


def _nullable_when_optional(schema: dict[str, Any]) -> None:
    """The JSON Schema says what validation does: an optional parameter may be null (it means omitted)."""
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        branches = prop.get("anyOf", [prop])
        if name in required or any(branch.get("type") == "null" for branch in branches):
            continue
        keep = {k: prop.pop(k) for k in ("default", "title", "description") if k in prop}
        schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **keep}


# The fields of the first request schema (a subset of chat.completions), which fingerprints were made of.
def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    """Only variables a model's own template reads (async_inference.limits.check_template_kwargs)."""
    # Imported here: the completions module imports this one; its raw-prompt template is this project's own.
    from async_inference.completions import RAW_PROMPT_TEMPLATE

    try:
        check_template_kwargs(value, own_template=RAW_PROMPT_TEMPLATE)
    except ValueError as exc:
        raise _refuse("invalid_template_kwargs", str(exc)) from exc
    return value


_FIRST_REQUEST_FIELDS = frozenset({"model", "messages", "max_tokens", "temperature", "top_p", "stop", "seed", "n"})
_FIRST_MESSAGE_FIELDS = frozenset({"role", "content", "name"})


class ChatCompletionRequest(_Strict):
    """``POST /v1/chat/completions`` as OpenAI takes it, less what a text-only job cannot do (refused by name).

    After validation ``max_tokens`` is the completion token limit whichever of ``max_tokens`` and
    ``max_completion_tokens`` gave it, and the sampling parameters hold their values (a null is the default)."""

    model_config = ConfigDict(json_schema_extra=_nullable_when_optional)

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    messages: list[ChatMessage] = Field(min_length=1, max_length=settings.MAX_MESSAGES)

    # Honoured: they change the answer.
    max_tokens: TokenLimit = settings.DEFAULT_MAX_TOKENS
    max_completion_tokens: TokenLimit | None = Field(
        default=None, description="OpenAI's newer name for max_tokens; give either, or both with the same value."
    )
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    n: ChoiceCount = 1
    stop: StopSequence | list[StopSequence] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[TokenId, Annotated[int, Field(ge=-100, le=100)]] | None = Field(
        default=None, description="Token id (as a string) to a bias from -100 (never) to 100 (always)."
    )
    logprobs: bool = False
    top_logprobs: int | None = Field(
        default=None, ge=0, le=settings.MAX_TOP_LOGPROBS, description="Needs logprobs: true."
    )
    response_format: ResponseFormat | None = None
    tools: list[Annotated[FunctionTool, BeforeValidator(_function_tool)]] | None = Field(
        default=None, max_length=settings.MAX_TOOLS
    )
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    functions: list[LegacyFunction] | None = Field(
        default=None, max_length=settings.MAX_TOOLS, description="Legacy: use tools."
    )
    function_call: FunctionCallChoice | None = Field(default=None, description="Legacy: use tool_choice.")
    # vLLM's extensions, honoured by the engines (transformers' generate and vLLM both have them).
    top_k: int | None = Field(
        default=None, ge=-1, description="vLLM extension: sample from the k likeliest tokens (0 or -1: all)."
    )
    min_p: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="vLLM extension: drop tokens below min_p times the likeliest token's probability.",
    )
    repetition_penalty: float | None = Field(
        default=None,
        gt=0.0,
        description="vLLM extension: >1 discourages repeating tokens of the prompt and the output.",
    )
    chat_template_kwargs: Annotated[dict[str, Any], AfterValidator(_template_kwargs)] | None = Field(
        default=None,
        description="vLLM extension: variables the model's own chat template reads (enable_thinking for Qwen3; "
        "docs/limits.md lists them); never a chat_template of the caller's.",
    )

    # Accepted without effect on a self-hosted text model (README: "The request").
    # Honoured by the OpenAI routes: the answer streams as the worker decodes (docs/streaming.md). A job sent to
    # POST /v1/jobs with it is streamed to its event log too, and answered as any job.
    stream: bool = Field(
        default=False,
        description="true: POST /v1/chat/completions answers with server-sent events (chat.completion.chunk) as the "
        "job decodes",
    )
    stream_options: StreamOptions | None = None
    user: Annotated[str, StringConstraints(max_length=256)] | None = None
    safety_identifier: Annotated[str, StringConstraints(max_length=64)] | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=settings.MAX_METADATA_KEYS)
    store: bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    prompt_cache_key: Annotated[str, StringConstraints(max_length=1024)] | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prediction: PredictedOutput | None = None
    modalities: list[Literal["text", "audio"]] | None = None

    # Refused: a text-only job cannot do them.
    audio: Annotated[
        None,
        *_refused_parameter(
            f"audio output is not supported: {TEXT_ONLY}; omit audio (and 'audio' from modalities) for a text answer"
        ),
    ] = None
    web_search_options: Annotated[
        None,
        *_refused_parameter(
            "web search is a tool OpenAI runs on its own servers; this deployment has none: search yourself and send the "
            "results in the messages, or declare a function tool"
        ),
    ] = None
    moderation: Annotated[
        None,
        *_refused_parameter(
            "moderation is a service OpenAI runs on its own servers; this deployment has none: omit moderation"
        ),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        # OpenAI takes an explicit null for an optional parameter as the parameter left out; so does this schema, and
        # the defaults apply (so the stored body, a null-free dump, validates the same).
        if isinstance(data, dict) and any(value is None for value in data.values()):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > settings.MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {settings.MAX_STOP_SEQUENCES} stop sequences are allowed")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and "audio" in value:
            raise _refuse(
                "unsupported_parameter",
                f"audio output is not supported: {TEXT_ONLY}; send modalities ['text'] or omit it",
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        given = self.model_fields_set
        if self.max_completion_tokens is not None:
            if "max_tokens" in given and self.max_tokens != self.max_completion_tokens:
                raise _field_error(
                    "max_completion_tokens",
                    "max_tokens and max_completion_tokens differ "
                    f"({self.max_tokens} and {self.max_completion_tokens}); give one of them",
                )
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise _field_error("top_logprobs", "top_logprobs needs logprobs: true")
        if self.tools is not None and self.functions is not None:
            raise _field_error("functions", "give tools or the legacy functions, not both (functions: use tools)")
        if self.tool_choice is not None and not self.tools:  # "none" too, as OpenAI answers
            raise _field_error("tool_choice", "tool_choice needs tools: declare the functions in tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            self._check_named(
                "tool_choice", self.tool_choice.function.name, [t.function.name for t in self.tools or ()]
            )
        if self.function_call is not None and not self.functions:
            raise _field_error("function_call", "function_call needs functions (or use tools and tool_choice)")
        if isinstance(self.function_call, NamedFunction):
            self._check_named("function_call", self.function_call.name, [f.name for f in self.functions or ()])
        return self

    @staticmethod
    def _check_named(field_name: str, name: str, declared: list[str]) -> None:
        if name not in declared:
            raise _field_error(
                field_name,
                f"names the function {name!r}, which is not among the declared ones ({', '.join(map(repr, declared))})",
            )

    def canonical(self) -> dict[str, Any]:
        """The request as JobSubmission.fingerprint() digests it: every field, defaults filled in, except that the
        fields added when the schema grew from its first subset are left out at their defaults (and
        max_completion_tokens always: max_tokens holds its value), so a request fingerprinted before keeps its
        fingerprint and an Idempotency-Key retry across the upgrade still matches its job."""
        fields = self.model_dump(mode="json")
        for name, info in type(self).model_fields.items():
            at_default = getattr(self, name) == info.get_default(call_default_factory=True)
            if name not in _FIRST_REQUEST_FIELDS and (name == "max_completion_tokens" or at_default):
                del fields[name]
        for message in fields["messages"]:
            for name in [n for n, value in message.items() if value is None and n not in _FIRST_MESSAGE_FIELDS]:
                del message[name]
        return fields

    # --- What the engines read -----------------------------------------------------------------------------------

    @property
    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def function_tools(self) -> list[FunctionDefinition]:
        """The functions the model may call: ``tools``, or the legacy ``functions``."""
        if self.tools:
            return [tool.function for tool in self.tools]
        return [FunctionDefinition.model_validate(f.model_dump(exclude_none=True)) for f in self.functions or ()]

    @property
    def tool_mode(self) -> Literal["none", "auto", "required"]:
        """Whether the model may (auto), must (required, or a named function) or must not call a function, from
        ``tool_choice`` or the legacy ``function_call``; OpenAI's default is auto when functions are declared."""
        choice = self.tool_choice if self.tools else self.function_call
        if not self.function_tools or choice == "none":
            return "none"
        if choice is None or choice == "auto":
            return "auto"
        return "required"

    @property
    def forced_function(self) -> str | None:
        """The function the model must call, when ``tool_choice`` (or ``function_call``) names one."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        if isinstance(self.function_call, NamedFunction):
            return self.function_call.name
        return None

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The schema the answer must validate against (``response_format`` json_schema), if any."""
        if isinstance(self.response_format, ResponseFormatJSONSchema):
            return self.response_format.json_schema.schema_ or {}
        return None

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as chat templates take them (transformers' ``apply_chat_template``, as vLLM hands them):
        content as one text, ``developer`` as ``system``, a legacy ``function`` result as a ``tool`` message, and tool
        call arguments parsed to objects where they are JSON."""
        out: list[dict[str, Any]] = []
        for message in self.messages:
            item: dict[str, Any] = {
                "role": {"developer": "system", "function": "tool"}.get(message.role, message.role),
                "content": message.text,
            }
            if message.name is not None:
                item["name"] = message.name
            if message.tool_call_id is not None:
                item["tool_call_id"] = message.tool_call_id
            calls = [(c.id, c.function) for c in message.tool_calls or ()]
            if message.function_call is not None:
                calls.append((f"call_{len(out)}", message.function_call))
            if calls:
                item["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": f.name, "arguments": _maybe_json(f.arguments)},
                    }
                    for call_id, f in calls
                ]
            out.append(item)
        return out


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _field_error(field_name: str, message: str) -> PydanticCustomError:
    """An error found across fields. A model validator's error is located at the model; ``ctx.field`` names the field
    to fix, and error_location() appends it."""
    return PydanticCustomError("invalid_parameter", "{message}", {"field": field_name, "message": message})


def error_message(error: Mapping[str, Any]) -> str:
    """What a validation error says; for a field the schema does not have, that it is unknown and where the known
    ones are listed."""
    if error.get("type") == "extra_forbidden":
        return "unknown field: not a field of this API's request (GET /v1/openapi.json lists them)"
    return str(error.get("msg", "invalid"))


def error_location(error: Mapping[str, Any], skip: Iterable[str] = ()) -> str:
    """The field a validation error names, as a dotted path into the body (``request.messages.0.content.1``): union
    tags and the ``skip`` names (a framework's own: "body", "query") left out, the field of a cross-field error
    appended. "(body)" when it names no field."""
    parts = [
        str(p)
        for p in error.get("loc", ())
        if not (isinstance(p, str) and (p.startswith(TAG_MARK) or p in skip or p.startswith("function-")))
    ]
    field_name = (error.get("ctx") or {}).get("field")
    if isinstance(field_name, str):
        parts.append(field_name)
    return ".".join(parts) or "(body)"


# --- Submission -----------------------------------------------------------------------------------------------------


class UploadSpec(_Strict):
    size_bytes: int = Field(ge=1, le=settings.MAX_UPLOAD_BYTES, description="Exact size of the body you will PUT.")


class WebhookSpec(_Strict):
    url: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    events: list[Literal["completed", "started"]] = Field(default_factory=lambda: ["completed"], min_length=1)


CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"
JobEndpoint = Literal["/v1/chat/completions", "/v1/embeddings", "/v1/completions"]


def _request_kind(value: Any) -> str:
    """Which request a job's ``request`` is, by its shape: an embeddings body has ``input`` and no ``messages``;
    anything else is validated (and its errors reported) as a chat request. ``endpoint`` must agree (checked after)."""
    if isinstance(value, dict):
        embedding = "input" in value and "messages" not in value
    else:
        embedding = isinstance(value, EmbeddingRequest)
    return TAG_MARK + ("embeddings" if embedding else "chat")


def engine_rows(request: ChatCompletionRequest | EmbeddingRequest) -> int:
    """The engine rows a request takes: a chat request's ``n`` choices are n generations; an embeddings request is
    one."""
    return request.n if isinstance(request, ChatCompletionRequest) else 1


JobRequest = Annotated[
    Union[  # noqa: UP007
        Annotated[ChatCompletionRequest, Tag(TAG_MARK + "chat")],
        Annotated[EmbeddingRequest, Tag(TAG_MARK + "embeddings")],
    ],
    Discriminator(_request_kind),
]


class JobSubmission(_Strict):
    """Body of ``POST /v1/jobs``: exactly one of ``request`` (inline) or ``upload`` (presigned PUT), for ``endpoint``
    (``/v1/chat/completions`` by default; ``/v1/embeddings``: ``request`` is an embeddings body, inline only)."""

    # The JSON Schema (and so the OpenAPI document) says "exactly one" as the validator below enforces it.
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["request"]}, {"required": ["upload"]}]})

    endpoint: JobEndpoint = Field(
        default=CHAT_ENDPOINT,
        description="The OpenAI endpoint the request is for: chat.completions, embeddings (answered as OpenAI's "
        "embedding list), or completions (a completions body: it runs as the chat request that continues its raw "
        "prompt, as a batch's completions lines do, and its result is that chat.completion).",
    )
    request: JobRequest | None = None
    upload: UploadSpec | None = None
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=settings.MAX_METADATA_KEYS)
    webhook: WebhookSpec | None = None
    ttl_seconds: int | None = Field(default=None, ge=1, le=settings.MAX_TTL_S)
    timeout_seconds: int | None = Field(default=None, ge=1, le=settings.MAX_EXECUTION_TIMEOUT_S)
    priority: JobPriority = Field(
        default="interactive",
        description='"interactive": the job queue, served first. "batch": the batch lane, beside batch chunks: the job '
        "runs in engine slots interactive jobs leave free, and is preempted (run again from the start) when an "
        "interactive job needs its slot. Its states, result and notifications are those of any job.",
    )

    @model_validator(mode="before")
    @classmethod
    def _completions_request(cls, data: Any) -> Any:
        """A completions job's body, checked as a completions request, becomes the chat request it runs."""
        if not isinstance(data, dict) or data.get("endpoint") != COMPLETIONS_ENDPOINT:
            return data
        if not isinstance(data.get("request"), dict):
            return data
        # Imported here: async_inference.completions builds its models on this module's.
        from async_inference.completions import CompletionRequest

        try:
            # to_chat() validates the chat request it makes, whose limits (4 stop sequences) a completion's may pass.
            completion = CompletionRequest.model_validate(data["request"]).to_chat()
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            location = error_location(first)
            field = "request" if location == "(body)" else f"request.{location}"
            raise _field_error(field, error_message(first)) from None
        return {**data, "request": completion}

    @model_validator(mode="after")
    def _exactly_one_source(self) -> JobSubmission:
        if (self.request is None) == (self.upload is None):
            raise ValueError(
                "give exactly one of 'request' (the chat.completions body) or 'upload' ({'size_bytes': N})"
            )
        embeddings = self.endpoint == EMBEDDINGS_ENDPOINT
        if self.endpoint != CHAT_ENDPOINT and self.upload is not None:
            raise _field_error("upload", f"a job for {self.endpoint} takes its request inline: send it as 'request'")
        if self.request is not None and embeddings != isinstance(self.request, EmbeddingRequest):
            wanted = "an embeddings body (model, input)" if embeddings else "a chat.completions body (model, messages)"
            raise _field_error("request", f"endpoint {self.endpoint} takes {wanted}")
        return self

    def fingerprint(self) -> str:
        """A digest of what the submission asks for, defaults filled in: two submissions that would make the same
        job have the same fingerprint, whatever their key order, spacing or omitted defaults."""
        fields = self.model_dump(mode="json")
        if self.request is not None:
            fields["request"] = self.request.canonical()
        if fields["priority"] == "interactive":
            # Left out at its default, so jobs fingerprinted before priority existed still match their retries.
            del fields["priority"]
        if fields["endpoint"] == CHAT_ENDPOINT:
            del fields["endpoint"]  # the same, for jobs fingerprinted before endpoint existed
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


# --- The claim check: the only thing on the queue -------------------------------------------------------------------


class ClaimCheck(_Internal):
    """A reference to a job's payload in S3. Never the prompt: it stays well under 1 KB."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    tenant: str
    bucket: str
    key: str
    model: str | None = None  # lets a fleet route by model without reading the payload
    deadline: dt.datetime  # still queued after this: the job expires and never runs
    timeout_s: int  # a running generation is aborted after this
    # The engine rows the request takes (its n), so that a worker's tenant share counts rows before it reads the
    # payload (gpu_worker.fairness). A claim check written before it existed reads as one row.
    rows: int = Field(1, ge=1)


class EmbeddingClaimCheck(ClaimCheck):
    """A job whose payload is an embeddings request (``JobSubmission.endpoint`` ``/v1/embeddings``): its own kind,
    so that the worker parses the payload as one (gpu_worker.claims)."""

    kind: Literal["embedding"] = "embedding"


class ChunkClaimCheck(_Internal):
    """A range of lines of a batch's input file, on the batch-lane queue (docs/design/batches.md). Never the lines."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    kind: Literal["batch_chunk"] = "batch_chunk"
    batch_id: str
    tenant: str
    bucket: str
    input_key: str  # the input file's object
    chunk: int = Field(ge=0)
    start_byte: int = Field(ge=0)  # first byte of the chunk's first line
    end_byte: int = Field(ge=0)  # last byte of the chunk's last line (inclusive, as an HTTP Range)
    first_line: int = Field(ge=1)  # line number of the first line in the input file (errors name lines)
    line_count: int = Field(ge=1)
    model: str | None = None
    deadline: dt.datetime  # the batch's completion window ends: lines not finished by then are batch_expired
    timeout_s: int  # one line's generation is aborted after this


class BatchControl(_Internal):
    """A step of a batch for the batch controller: plan it (validate and chunk its input), or finalize it."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    kind: Literal["plan", "finalize"]
    batch_id: str
    tenant: str


class BatchLineError(BaseModel):
    code: str
    message: str


class BatchLineResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class BatchLineOutput(BaseModel):
    """One line of a batch's output or error file, in OpenAI's format."""

    id: str  # batch_req_...
    custom_id: str
    response: BatchLineResponse | None = None
    error: BatchLineError | None = None


class UploadDeadline(_Internal):
    """The scheduled end of an upload job's presign window: its job expires then if the upload has not arrived."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    job_id: str = Field(pattern=JOB_ID_PATTERN)


# --- The stored job -------------------------------------------------------------------------------------------------


class Job(_Internal):
    """A job as the state store holds it."""

    job_id: str
    tenant: str
    status: JobStatus
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    attempts: int = 0
    model: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    error: str | None = None
    # The OpenAI error code of a failure that is the request's fault (``context_length_exceeded``): a client error, not
    # to be retried; None for any other failure (``server_error``).
    error_code: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    request_bucket: str
    request_key: str
    result_key: str | None = None
    # When the bucket's lifecycle may delete the result (settings.lifecycle_expiry of its write); set with the result.
    result_expires_at: dt.datetime | None = None
    upload_size_bytes: int | None = None
    deadline: dt.datetime
    timeout_s: int
    idempotency_key: str | None = None
    # JobSubmission.fingerprint() of the request that created the job: a retry with its Idempotency-Key must match.
    request_fingerprint: str | None = None
    webhook: WebhookState | None = None
    notified: bool = False
    progress: JobProgress | None = None  # written while the job runs (gpu_worker.progress)
    priority: JobPriority = "interactive"  # "batch": its claim check goes to the batch-lane queue
    # When the upload intake sent an upload job's one claim check (UploadIntake.accept_upload); unset between its
    # acceptance and the send, so a redelivered event can tell an interrupted acceptance from a replayed PUT.
    claim_sent_at: dt.datetime | None = None
    # The worker running the job, and until when (epoch milliseconds) its hold stands: renewed with the visibility of
    # the job's message, so no other worker starts the job until the holder's visibility has run out (jobs.py).
    lease_owner: str | None = None
    lease_expires_ms: int | None = None
    endpoint: str | None = None  # JobSubmission.endpoint when not chat.completions (its claim check's kind says it)
    rows: int = 1  # engine_rows of its request, carried by its claim check; set when the request is known

    @property
    def upload_window_ends_at(self) -> dt.datetime:
        """When the presigned upload of an upload job stops working: PRESIGNED_UPLOAD_EXPIRY_S after creation, or the
        job's deadline if that comes first. Every URL for the job (an idempotent retry presigns anew) ends then."""
        return min(self.created_at + dt.timedelta(seconds=settings.PRESIGNED_UPLOAD_EXPIRY_S), self.deadline)

    def claim_check(self) -> ClaimCheck:
        kind = EmbeddingClaimCheck if self.endpoint == EMBEDDINGS_ENDPOINT else ClaimCheck
        return kind(
            job_id=self.job_id,
            tenant=self.tenant,
            bucket=self.request_bucket,
            key=self.request_key,
            model=self.model,
            deadline=self.deadline,
            timeout_s=self.timeout_s,
            rows=self.rows,
        )


# --- The notification -----------------------------------------------------------------------------------------------


class S3Location(BaseModel):
    bucket: str
    key: str


class Timings(BaseModel):
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    queue_s: float | None = None
    run_s: float | None = None


class ResultNotification(_Internal):
    """The message published to the result topic when a job reaches a final state.

    Message attributes ``status``, ``tenant`` and ``model`` carry the same values so that subscriptions can filter.
    """

    schema_version: Literal["1"] = SCHEMA_VERSION
    event: Literal["job.completed"] = "job.completed"
    job_id: str
    tenant: str
    status: JobStatus
    model: str | None = None
    result_location: S3Location | None = None
    result: ChatCompletion | EmbeddingList | None = Field(
        default=None, description=f"The result itself when it is at most {settings.MAX_INLINE_RESULT_BYTES} bytes."
    )
    usage: Usage | None = None
    error: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    timings: Timings

    @field_serializer("result")
    def _result_as_stored(self, result: ChatCompletion | EmbeddingList | None) -> dict[str, Any] | None:
        # The inline result is the stored object, nulls included (``"refusal": null``, ``"logprobs": null`` as OpenAI
        # writes them), though the notification itself is published without its unset fields (exclude_none).
        return None if result is None else result.model_dump(mode="json")


# --- The WebSocket API: what a client sends to be told, and what it is told -----------------------------------------


class BatchEvent(_Internal):
    """A message the WebSocket API pushes to a connection that follows a batch (or all of its tenant's work): the
    batch ended. Its output and error files come from ``GET /v1/batches/{id}``."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    type: Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
    batch_id: str
    status: str
    request_counts: dict[str, int] | None = None  # total, completed, failed


# The event type that tells a job's final status; the result notification's own ``event`` is "job.completed" for
# every final status (as the per-job webhook names it), a pushed event says which end it was.
FINAL_EVENT_TYPES: dict[JobStatus, JobEventType] = {
    JobStatus.SUCCEEDED: "job.completed",
    JobStatus.FAILED: "job.failed",
    JobStatus.CANCELLED: "job.cancelled",
    JobStatus.EXPIRED: "job.expired",
}


class JobActivity(_Internal):
    """What a worker publishes to the job event topic while a job runs: it entered the engine (``job.started``), or it
    generated more tokens (``job.progress``, at most once per progress interval). Message attributes ``event`` and
    ``tenant`` carry the same values. The final events come from the result topic's ``ResultNotification``."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    event: Literal["job.started", "job.progress"]
    job_id: str = Field(pattern=JOB_ID_PATTERN)
    tenant: str
    model: str | None = None
    started_at: dt.datetime | None = None
    progress: JobProgress | None = None
