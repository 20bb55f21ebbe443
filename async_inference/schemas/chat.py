"""The request: an OpenAI chat.completions body, its tools and response formats (its messages:
``async_inference.schemas.messages``), and what the engines read of it. The answer (``ChatCompletion``) is the client
package's model (``async_inference_client.models.chat``)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_validator,
    model_validator,
)

from async_inference import settings
from async_inference.limits import check_template_kwargs
from async_inference.schemas.fields import (
    HOSTED_TOOLS,
    TAG_MARK,
    TEXT_ONLY,
    ChoiceCount,
    FunctionName,
    JSONSchemaObject,
    MetadataKey,
    MetadataValue,
    Penalty,
    PromptCacheOptions,
    StopSequence,
    StreamOptions,
    Text,
    TokenId,
    TokenLimit,
    ToolMode,
    by_type,
    field_error,
    refuse,
    shape,
    tool_choice,
)
from async_inference.schemas.messages import ChatMessage, Content
from async_inference_client.models.base import StrictModel

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

CHAT_ENDPOINT = "/v1/chat/completions"


class LegacyFunction(StrictModel):
    """A function of the legacy ``functions`` parameter."""

    name: FunctionName
    description: Text | None = None
    parameters: JSONSchemaObject | None = None


class FunctionDefinition(LegacyFunction):
    strict: bool | None = None


def _function_tool(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in HOSTED_TOOLS:
        raise refuse(
            "unsupported_tool",
            f"{kind!r} is a tool OpenAI runs on its own servers; this deployment runs "
            "none: declare a function tool and run it yourself",
        )
    if kind == "custom":
        raise refuse(
            "unsupported_tool",
            "custom (free-form text or grammar) tools are not supported: declare a "
            "function tool whose parameters are a JSON schema",
        )
    return value


class FunctionTool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: FunctionName


class NamedToolChoice(StrictModel):
    """``tool_choice`` naming the function the model must call."""

    type: Literal["function"]
    function: NamedFunction


def _named_tool_choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "allowed_tools":
        raise refuse(
            "unsupported_tool_choice",
            "allowed_tools is not supported: send only the allowed tools in "
            "tools, with tool_choice 'auto' or 'required'",
        )
    if kind == "custom":
        raise refuse("unsupported_tool_choice", "custom tools are not supported: name a function tool")
    return value


ToolChoice = tool_choice(NamedToolChoice, _named_tool_choice, "{'type': 'function', 'function': {'name': ...}}")


FunctionCallChoice = Annotated[
    Annotated[Literal["none", "auto"], Tag(TAG_MARK + "str")] | Annotated[NamedFunction, Tag(TAG_MARK + "object")],
    Discriminator(
        shape,
        custom_error_type="function_call_type",
        custom_error_message="function_call must be 'none', 'auto' or {'name': ...}",
    ),
]


class JSONSchemaFormat(StrictModel):
    name: FunctionName
    description: str | None = None
    # ``schema`` is the wire name; the attribute would shadow BaseModel.schema (as in openai-python's own model).
    schema_: JSONSchemaObject | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=False)


class ResponseFormatText(StrictModel):
    type: Literal["text"]


class ResponseFormatJSONObject(StrictModel):
    type: Literal["json_object"]


class ResponseFormatJSONSchema(StrictModel):
    type: Literal["json_schema"]
    json_schema: JSONSchemaFormat


ResponseFormat = by_type(
    ResponseFormatText, ResponseFormatJSONObject, ResponseFormatJSONSchema, field="response_format"
)


class PredictedOutput(StrictModel):
    type: Literal["content"]
    content: Content


def _refused_parameter(message: str) -> Any:
    """A parameter OpenAI takes that this deployment refuses unless null: the 400's message is the documented one."""

    def check(value: Any) -> Any:
        if value is not None:
            raise refuse("unsupported_parameter", message)
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


# The chat template of a /v1/completions job or line (async_inference.schemas.completions): it writes the one message
# verbatim, so the model continues the raw prompt. This project's own template, the one a request may name.
RAW_PROMPT_TEMPLATE = "{{ messages[0]['content'] }}"


def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    """Only variables a model's own template reads (async_inference.limits.check_template_kwargs)."""
    try:
        check_template_kwargs(value, own_template=RAW_PROMPT_TEMPLATE)
    except ValueError as exc:
        raise refuse("invalid_template_kwargs", str(exc)) from exc
    return value


# The fields of the first request schema (a subset of chat.completions), which fingerprints were made of.
_FIRST_REQUEST_FIELDS = frozenset({"model", "messages", "max_tokens", "temperature", "top_p", "stop", "seed", "n"})
_FIRST_MESSAGE_FIELDS = frozenset({"role", "content", "name"})


class ChatCompletionRequest(StrictModel):
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
            raise refuse(
                "unsupported_parameter",
                f"audio output is not supported: {TEXT_ONLY}; send modalities ['text'] or omit it",
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        given = self.model_fields_set
        if self.max_completion_tokens is not None:
            if "max_tokens" in given and self.max_tokens != self.max_completion_tokens:
                raise field_error(
                    "max_completion_tokens",
                    "max_tokens and max_completion_tokens differ "
                    f"({self.max_tokens} and {self.max_completion_tokens}); give one of them",
                )
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise field_error("top_logprobs", "top_logprobs needs logprobs: true")
        if self.tools is not None and self.functions is not None:
            raise field_error("functions", "give tools or the legacy functions, not both (functions: use tools)")
        if self.tool_choice is not None and not self.tools:  # "none" too, as OpenAI answers
            raise field_error("tool_choice", "tool_choice needs tools: declare the functions in tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            self._check_named(
                "tool_choice", self.tool_choice.function.name, [t.function.name for t in self.tools or ()]
            )
        if self.function_call is not None and not self.functions:
            raise field_error("function_call", "function_call needs functions (or use tools and tool_choice)")
        if isinstance(self.function_call, NamedFunction):
            self._check_named("function_call", self.function_call.name, [f.name for f in self.functions or ()])
        return self

    @staticmethod
    def _check_named(field_name: str, name: str, declared: list[str]) -> None:
        if name not in declared:
            raise field_error(
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
    def tool_mode(self) -> ToolMode:
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
