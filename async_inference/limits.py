"""The cost of one request, bounded before it reaches the shared engine (docs/limits.md has the table).

A chat request can ask the engine for work no other tenant's request pays for: a grammar compiled from a large
``json_schema`` (or a forced tool's ``parameters``), a prompt templated and tokenized only to be refused for the
model's context, ``n`` full generations of ``max_tokens`` each. ``check_request`` bounds each one and raises
``LimitExceeded`` naming the field and the limit; the API answers it with a 400 (``POST /v1/jobs``, background
responses), an upload job fails with it when its upload is accepted, a batch line gets it as its 400 error record
(``BatchInputLine.request``). The worker may call ``check_request`` again on what it reads: it needs nothing but the
request and the limits.

The limits are a deployment's (``RequestLimits``: the ``request_limits`` context, the ``REQUEST_LIMITS`` setting), and
a tenant's plan may change any of them (``LimitOverrides``, its ``request_limits``; ``limits_for``).

What a chat template may be handed is bounded here too: only the variables some model family's own template reads
(``TEMPLATE_KWARGS``), never a template of the caller's (vLLM refuses ``chat_template`` from a request), never a
keyword the engine sets itself (``tokenize``...): ``check_template_kwargs``, run by the request schema.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:  # the request schema imports this module (its chat_template_kwargs check)
    from async_inference.schemas import ChatCompletionRequest


class RequestLimits(BaseModel):
    """One deployment's (or, merged with a plan's overrides, one tenant's) bounds on a request's cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_schema_bytes: int = Field(
        32 * 1024, ge=1, description="bytes of one json_schema (response_format, a forced tool's parameters), compact"
    )
    max_schema_depth: int = Field(32, ge=1, description="nesting of objects and arrays in one json_schema")
    max_schema_alternatives: int = Field(
        128, ge=1, description="anyOf and oneOf branches in one json_schema, all counted (each grows the grammar)"
    )
    context_tokens: int = Field(
        32_768, ge=1, description="the served model's context length (vLLM's max_model_len); the smallest of them"
    )
    max_bytes_per_token: float = Field(
        8.0,
        gt=0,
        description="the most UTF-8 bytes one prompt token is taken to hold: a prompt of B bytes is at least "
        "B / max_bytes_per_token tokens",
    )
    max_request_tokens: int = Field(
        16_384, ge=1, description="n x max_tokens: the completion tokens (and rows) one request may ask for"
    )


class LimitOverrides(BaseModel):
    """A tenant plan's changes to the deployment's limits (each unset: the deployment's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_schema_bytes: int | None = Field(None, ge=1)
    max_schema_depth: int | None = Field(None, ge=1)
    max_schema_alternatives: int | None = Field(None, ge=1)
    context_tokens: int | None = Field(None, ge=1)
    max_bytes_per_token: float | None = Field(None, gt=0)
    max_request_tokens: int | None = Field(None, ge=1)


def limits_for(deployment: RequestLimits, overrides: LimitOverrides | None) -> RequestLimits:
    """The limits one tenant's requests are held to: the deployment's, with its plan's overrides."""
    if overrides is None:
        return deployment
    return deployment.model_copy(update=overrides.model_dump(exclude_none=True))


class LimitExceeded(ValueError):
    """A request over one of its limits: ``field`` is what to fix, ``limit`` the limit's name in docs/limits.md."""

    def __init__(self, field: str, limit: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.limit = limit
        self.message = message


# --- Checks ---------------------------------------------------------------------------------------------------------


def check_request(request: ChatCompletionRequest, limits: RequestLimits) -> None:
    """Every bound on a chat request's cost; the first one it passes raises ``LimitExceeded``."""
    for field, schema in grammar_schemas(request):
        check_schema(schema, field, limits)
    check_choices(request, limits)
    check_prompt(request, limits)


def grammar_schemas(request: ChatCompletionRequest) -> list[tuple[str, dict[str, Any]]]:
    """The JSON schemas the engine compiles into a grammar for ``request``, each with the field that holds it: the
    ``response_format`` schema, and the ``parameters`` of the functions the model is made to call (all of them with
    ``tool_choice: "required"``, the named one when it names one)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if request.json_schema is not None:
        found.append(("response_format.json_schema.schema", request.json_schema))
    if request.tool_mode != "required":
        return found
    forced = request.forced_function
    prefix = "tools.{}.function.parameters" if request.tools else "functions.{}.parameters"
    for index, function in enumerate(request.function_tools):
        if function.parameters is not None and forced in (None, function.name):
            found.append((prefix.format(index), function.parameters))
    return found


def check_schema(schema: Mapping[str, Any], field: str, limits: RequestLimits) -> None:
    """A json_schema the engine would compile, within the schema limits: its compact size, its nesting and its count
    of anyOf/oneOf branches."""
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limits.max_schema_bytes:
        raise LimitExceeded(
            field,
            "max_schema_bytes",
            f"the schema is {size} bytes, over this deployment's limit of {limits.max_schema_bytes} (max_schema_bytes); "
            "send a smaller schema",
        )
    depth, alternatives = _shape(schema)
    if depth > limits.max_schema_depth:
        raise LimitExceeded(
            field,
            "max_schema_depth",
            f"the schema nests {depth} levels deep, over this deployment's limit of {limits.max_schema_depth} "
            "(max_schema_depth); flatten it",
        )
    if alternatives > limits.max_schema_alternatives:
        raise LimitExceeded(
            field,
            "max_schema_alternatives",
            f"the schema has {alternatives} anyOf/oneOf branches, over this deployment's limit of "
            f"{limits.max_schema_alternatives} (max_schema_alternatives); use fewer alternatives (an enum, for one)",
        )


def _shape(schema: Mapping[str, Any]) -> tuple[int, int]:
    """A schema's nesting depth (objects and arrays) and its anyOf/oneOf branches, walked without recursion (the
    body's own parser bounds nesting already, but this walk must not depend on it)."""
    depth = alternatives = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in ("anyOf", "oneOf") and isinstance(value, list):
                    alternatives += len(value)
                if isinstance(value, Mapping | list):
                    stack.append((value, level + 1))
        else:
            stack.extend((item, level + 1) for item in node if isinstance(item, Mapping | list))
    return depth, alternatives


def check_choices(request: ChatCompletionRequest, limits: RequestLimits) -> None:
    """``n`` choices of ``max_tokens`` each are n generations (n engine rows): their product within
    ``max_request_tokens``."""
    asked = request.n * request.max_tokens
    if asked > limits.max_request_tokens:
        raise LimitExceeded(
            "n",
            "max_request_tokens",
            f"n x max_tokens is {request.n} x {request.max_tokens} = {asked} completion tokens, over this deployment's "
            f"limit of {limits.max_request_tokens} for one request (max_request_tokens); lower n or max_tokens, or "
            "send several requests",
        )


def prompt_bytes(request: ChatCompletionRequest) -> int:
    """The UTF-8 bytes of what a chat template writes into the prompt from the request: each message's text, name,
    and tool calls, and the declared functions."""
    total = 0
    for message in request.messages:
        total += len(message.text.encode()) + len((message.name or "").encode())
        for call in message.tool_calls or ():
            total += len(call.function.name.encode()) + len(call.function.arguments.encode())
        if message.function_call is not None:
            total += len(message.function_call.name.encode()) + len(message.function_call.arguments.encode())
    for function in request.function_tools:
        total += len(function.model_dump_json(exclude_none=True).encode())
    return total


def estimate_prompt_tokens(request: ChatCompletionRequest, limits: RequestLimits) -> int:
    """The fewest tokens the request's prompt can take: its bytes over ``max_bytes_per_token``.

    A tokenizer's tokens average 3 to 5 bytes of ordinary text; ``max_bytes_per_token`` (8 by default) is taken above
    that on purpose, so that the estimate stays under the true count and a request refused for it is one the engine
    would refuse too. The chat template's own tokens are not counted (they only add to the true count)."""
    return math.ceil(prompt_bytes(request) / limits.max_bytes_per_token)


def check_prompt(request: ChatCompletionRequest, limits: RequestLimits) -> None:
    """The prompt's estimated tokens plus ``max_tokens`` within the model's context, as vLLM checks it once the prompt
    is tokenized, but before the engine templates and tokenizes it."""
    tokens = estimate_prompt_tokens(request, limits)
    if tokens + request.max_tokens > limits.context_tokens:
        raise LimitExceeded(
            "messages",
            "context_tokens",
            f"the prompt is {prompt_bytes(request)} bytes, at least {tokens} tokens (at most "
            f"{limits.max_bytes_per_token:g} bytes a token); with max_tokens {request.max_tokens} it cannot fit the "
            f"model's context of {limits.context_tokens} tokens (context_tokens); shorten the messages or lower "
            "max_tokens",
        )


# A chat request's field as the request it was converted from names it: a background response's or a /v1/responses
# batch line's (its input, its text.format, its tools without "function"), a /v1/completions line's (its prompt).
_RESPONSES_FIELDS = {"messages": "input", "response_format.json_schema.schema": "text.format.schema"}
_COMPLETIONS_FIELDS = {"messages": "prompt"}


def field_in(endpoint: str | None, field: str) -> str:
    """``field`` of the chat request the engine runs, as the request sent to ``endpoint`` names it (None: chat)."""
    if endpoint == "/v1/responses":
        if field.startswith("tools.") and ".function." in field:
            field = field.replace(".function.", ".", 1)
        return _RESPONSES_FIELDS.get(field, field)
    if endpoint == "/v1/completions":
        return _COMPLETIONS_FIELDS.get(field, field)
    return field


# --- Chat template variables ----------------------------------------------------------------------------------------

# The variables each model family's own chat template reads, by the family (docs/limits.md). A request may set these
# and no other: a template ignores a variable it does not read, so the union is accepted whatever the model.
TEMPLATE_KWARGS: dict[str, frozenset[str]] = {
    "Qwen3, SmolLM3": frozenset({"enable_thinking"}),
    "DeepSeek-V3.1, Granite 3.2+": frozenset({"thinking"}),
    "gpt-oss": frozenset({"reasoning_effort"}),
    "Llama 3.1+": frozenset({"date_string", "tools_in_user_message"}),
}
ALLOWED_TEMPLATE_KWARGS = frozenset().union(*TEMPLATE_KWARGS.values())
# What the engine passes to apply_chat_template itself: the caller may not set them (a second value is a TypeError in
# transformers, and a template of the caller's would run its code on the shared engine).
ENGINE_TEMPLATE_KWARGS = frozenset(
    {"chat_template", "tokenize", "add_generation_prompt", "continue_final_message", "tools", "documents"}
)
MAX_TEMPLATE_KWARG_CHARS = 64


def check_template_kwargs(kwargs: Mapping[str, Any], *, own_template: str | None = None) -> None:
    """``chat_template_kwargs`` as a model's own template may take them: keys from ``ALLOWED_TEMPLATE_KWARGS``, each a
    boolean, a number or a short string. ``own_template``: the one ``chat_template`` this project itself passes (a
    completions line's, async_inference.schemas.completions), which is not the caller's. ValueError saying what to
    fix."""
    for key, value in kwargs.items():
        if key == "chat_template" and own_template is not None and value == own_template:
            continue
        if key == "chat_template":
            raise ValueError(
                "chat_template: a chat template of the caller's is not accepted (as vLLM refuses it); the model's own "
                "template is used: omit chat_template"
            )
        if key in ENGINE_TEMPLATE_KWARGS:
            raise ValueError(f"{key}: the engine sets {key} itself; omit it from chat_template_kwargs")
        if key not in ALLOWED_TEMPLATE_KWARGS:
            raise ValueError(
                f"{key}: no supported model's chat template reads {key!r}; chat_template_kwargs takes "
                f"{', '.join(sorted(ALLOWED_TEMPLATE_KWARGS))} (docs/limits.md)"
            )
        if not isinstance(value, bool | int | float | str) or (
            isinstance(value, str) and len(value) > MAX_TEMPLATE_KWARG_CHARS
        ):
            raise ValueError(
                f"{key}: a template variable is a boolean, a number or a string of at most "
                f"{MAX_TEMPLATE_KWARG_CHARS} characters"
            )


# --- What an error may quote ----------------------------------------------------------------------------------------

# An error quotes what the caller sent (a field's name, a method, a custom_id); it is stored in a record that DynamoDB
# holds to 400 KB. A 420 KB method or a 1 MB field name quoted whole made the write fail on every retry, and the batch
# or the upload job ended with no error at all.
MAX_ERROR_CHARS = 1_000


def clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` when it is at most ``limit`` characters, else its start and how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text) - limit + 40} more characters)"
