"""What OpenAI itself would do with a chat.completions body, decided from its fields: the reference the conformance
test holds this service to. Written apart from the service's schema (so that the schema is checked, not restated):
the parameter and message field names come from the official SDK's request types (``openai.types.chat``), the
ranges and rules from OpenAI's API reference.

Each body is one of:
- ``invalid``: OpenAI refuses it (an unknown parameter, a wrong type, a value out of its documented range);
- ``out_of_scope``: OpenAI takes it, but it asks for what a self-hosted text-only job cannot do: image,
  audio or file inputs, audio output, OpenAI-hosted services (web search, moderation), custom tools. The service
  must refuse it with a 400 naming one of ``fields``;
- ``valid``: OpenAI takes it and a text model can answer it: the service must accept it.

The reference is OpenAI's API plus the extensions of vLLM's OpenAI server the service documents and its engines honour
(``top_k``, ``min_p``, ``repetition_penalty``, ``chat_template_kwargs``, with vLLM's ranges): a body that uses them is
valid, as vLLM's server takes it. Where OpenAI's documents are silent, recorded traffic of api.openai.com in the
corpus decides: an explicit null for any optional parameter is taken as omitted, ``name`` is taken on every message,
and an assistant message sent back with a response's ``annotations`` is taken.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionDeveloperMessageParam,
    ChatCompletionFunctionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
    completion_create_params,
)

CORPUS = Path(__file__).parent / "corpus" / "requests.jsonl"
CHAT = "/v1/chat/completions"
MODEL_PLACEHOLDER = "{{MODEL}}"

_HINTS = typing.get_type_hints(completion_create_params.CompletionCreateParamsBase)
VLLM_EXTENSIONS = frozenset({"top_k", "min_p", "repetition_penalty", "chat_template_kwargs"})
PARAMETERS = frozenset(_HINTS) | {"stream"} | VLLM_EXTENSIONS  # the SDK's streaming variants add stream
MESSAGE_FIELDS = {
    "developer": set(ChatCompletionDeveloperMessageParam.__annotations__),
    "system": set(ChatCompletionSystemMessageParam.__annotations__),
    "user": set(ChatCompletionUserMessageParam.__annotations__),
    "assistant": set(ChatCompletionAssistantMessageParam.__annotations__) | {"annotations"},
    "tool": set(ChatCompletionToolMessageParam.__annotations__) | {"name"},
    "function": set(ChatCompletionFunctionMessageParam.__annotations__),
}
PART_TYPES = {"user": {"text", "image_url", "input_audio", "file"}, "assistant": {"text", "refusal"}}
NON_TEXT_PARTS = {"image_url", "input_audio", "file"}
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_N = 128


def _literals(annotation: Any) -> set[Any]:
    """The values of the Literal types inside an annotation (Optional[Literal[...]] and the like)."""
    if typing.get_origin(annotation) is typing.Literal:
        return set(typing.get_args(annotation))
    return set().union(*(_literals(arg) for arg in typing.get_args(annotation)))


ENUMS = {
    name: _literals(_HINTS[name])
    for name in ("service_tier", "reasoning_effort", "verbosity", "prompt_cache_retention")
}


class Invalid(Exception):
    """OpenAI would refuse the body: the message says why."""


@dataclass
class Verdict:
    kind: str  # "valid", "out_of_scope" or "invalid"
    reason: str = ""
    fields: set[str] = field(default_factory=set)  # out_of_scope: the fields a refusal may name


def _number(value: Any, low: float, high: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise Invalid(f"{name} must be a number from {low} to {high}, got {value!r}")


def _integer(value: Any, low: int, high: float, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Invalid(f"{name} must be an integer from {low} to {high}, got {value!r}")


def _is(value: Any, kind: type | tuple[type, ...], name: str) -> None:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise Invalid(f"{name} must be a {getattr(kind, '__name__', kind)}, got {value!r}")


def _check_parameters(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name not in PARAMETERS:
            raise Invalid(f"unknown parameter {name}")
        if value is None and name not in ("model", "messages"):
            continue
        if name in ("temperature",):
            _number(value, 0, 2, name)
        elif name == "top_p":
            _number(value, 0, 1, name)
        elif name in ("presence_penalty", "frequency_penalty"):
            _number(value, -2, 2, name)
        elif name == "n":
            _integer(value, 1, MAX_N, name)
        elif name in ("max_tokens", "max_completion_tokens"):
            _integer(value, 1, float("inf"), name)
        elif name == "top_logprobs":
            _integer(value, 0, 20, name)
            if body.get("logprobs") is not True:
                raise Invalid("top_logprobs needs logprobs: true")
        elif name == "seed":
            _integer(value, -(2**63), 2**63 - 1, name)
        elif name in ("logprobs", "stream", "store", "parallel_tool_calls"):
            _is(value, bool, name)
        elif name in ("user", "prompt_cache_key", "safety_identifier"):
            _is(value, str, name)
        elif name == "top_k":
            _integer(value, -1, float("inf"), name)
        elif name == "min_p":
            _number(value, 0, 1, name)
        elif name == "repetition_penalty":
            _number(value, 1e-9, float("inf"), name)
        elif name == "chat_template_kwargs":
            _is(value, dict, name)
        elif name in ENUMS and value not in ENUMS[name]:
            raise Invalid(f"{name} must be one of {sorted(ENUMS[name])}, got {value!r}")
        elif name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
                raise Invalid(f"stop must be a string or up to 4 strings, got {value!r}")
        elif name == "logit_bias":
            _is(value, dict, name)
            for token, bias in value.items():
                if not token.isdigit():
                    raise Invalid(f"logit_bias keys are token ids, got {token!r}")
                _integer(bias, -100, 100, f"logit_bias[{token}]")
        elif name == "metadata":
            _is(value, dict, name)
            if len(value) > 16 or not all(isinstance(v, str) for v in value.values()):
                raise Invalid("metadata is up to 16 string values")
        elif name == "response_format":
            _check_response_format(value)
        elif name in (
            "stream_options",
            "prediction",
            "audio",
            "web_search_options",
            "moderation",
            "prompt_cache_options",
        ):
            _is(value, dict, name)
        elif name == "modalities":
            if not isinstance(value, list) or not set(value) <= {"text", "audio"}:
                raise Invalid(f"modalities must be a list of 'text' and 'audio', got {value!r}")
    _check_tools(body)
    if (
        "max_tokens" in body
        and "max_completion_tokens" in body
        and None not in (body["max_tokens"], body["max_completion_tokens"])
    ):
        if body["max_tokens"] != body["max_completion_tokens"]:
            raise Invalid("max_tokens and max_completion_tokens differ")


def _check_response_format(value: Any) -> None:
    _is(value, dict, "response_format")
    kind = value.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise Invalid(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not NAME.match(spec["name"]):
            raise Invalid("response_format.json_schema needs a name of letters, digits, _ and -")
        if not isinstance(spec.get("schema", {}), dict):
            raise Invalid("response_format.json_schema.schema must be an object")


def _check_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools") or []
    _is(tools, list, "tools")
    names = []
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        spec = tool.get(kind) if kind in ("function", "custom") else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not NAME.match(spec["name"]):
            raise Invalid(f"a tool must be a function or custom tool with a name, got {tool!r}")
        if kind == "function" and not isinstance(spec.get("parameters", {}), dict):
            raise Invalid("a function's parameters must be a JSON schema object")
        names.append(spec["name"])
    choice = body.get("tool_choice")
    if choice is not None:
        if not tools:
            raise Invalid("tool_choice is only allowed when tools are given")
        if isinstance(choice, dict):
            kind = choice.get("type")
            named = (choice.get(kind) or {}).get("name") if kind in ("function", "custom") else None
            if kind not in ("function", "custom", "allowed_tools") or (kind != "allowed_tools" and named not in names):
                raise Invalid(f"tool_choice names no declared tool: {choice!r}")
        elif choice not in ("none", "auto", "required"):
            raise Invalid(f"tool_choice must be none, auto or required, got {choice!r}")
    functions = body.get("functions") or []
    _is(functions, list, "functions")
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) and NAME.match(f["name"]) for f in functions):
        raise Invalid("each of functions needs a name")
    call = body.get("function_call")
    if call is not None:
        if not functions:
            raise Invalid("function_call is only allowed when functions are given")
        if isinstance(call, dict):
            if call.get("name") not in [f["name"] for f in functions]:
                raise Invalid("function_call names no declared function")
        elif call not in ("none", "auto"):
            raise Invalid(f"function_call must be none, auto or a name, got {call!r}")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise Invalid("messages must be a non-empty list")
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in MESSAGE_FIELDS:
            raise Invalid(f"messages.{i}.role must be one of {sorted(MESSAGE_FIELDS)}, got {role!r}")
        if unknown := set(message) - MESSAGE_FIELDS[role]:
            raise Invalid(f"messages.{i} ({role}) has unknown fields {sorted(unknown)}")
        content = message.get("content")
        if content is None:
            if not (
                role == "function"
                or (role == "assistant" and (message.get("tool_calls") or message.get("function_call")))
            ):
                raise Invalid(f"messages.{i} ({role}) needs content")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in PART_TYPES.get(role, {"text"}) or kind not in part:
                    raise Invalid(f"messages.{i}.content.{j} is not a {role} content part: {kind!r}")
        elif not isinstance(content, str):
            raise Invalid(f"messages.{i}.content must be a string or a list of parts")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise Invalid(f"messages.{i} (tool) needs tool_call_id")
        if role == "function" and not isinstance(message.get("name"), str):
            raise Invalid(f"messages.{i} (function) needs name")
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("arguments"), str) or not call.get("id"):
                raise Invalid(f"messages.{i}.tool_calls has a malformed call: {call!r}")


def _out_of_scope(body: dict[str, Any]) -> tuple[str, set[str]]:
    """What a text-only job cannot do in a body OpenAI takes: the reasons, and the fields a refusal may name."""
    reasons, fields = [], set()

    def add(reason: str, where: str) -> None:
        reasons.append(reason)
        fields.add(where)

    for i, message in enumerate(body["messages"]):
        for j, part in enumerate(message["content"] if isinstance(message.get("content"), list) else ()):
            if part["type"] in NON_TEXT_PARTS:
                add(f"{part['type']} input", f"messages.{i}.content.{j}")
        if message.get("audio") is not None:
            add("audio in the history", f"messages.{i}.audio")
    if body.get("audio") is not None:
        add("audio output", "audio")
    if "audio" in (body.get("modalities") or ()):
        add("audio output", "modalities")
    for name in ("web_search_options", "moderation"):
        if body.get(name) is not None:
            add(f"OpenAI-hosted {name.removesuffix('_options').replace('_', ' ')}", name)
    for i, tool in enumerate(body.get("tools") or ()):
        if tool["type"] != "function":
            add(f"{tool['type']} tool", f"tools.{i}")
    if isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("type") != "function":
        add(f"tool_choice {body['tool_choice']['type']}", "tool_choice")
    return ", ".join(reasons), fields


def classify(body: Any) -> Verdict:
    """What OpenAI would do with this chat.completions body, and whether a text-only job can answer it."""
    try:
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
            raise Invalid("model must be a non-empty string")
        _check_messages(body.get("messages"))
        _check_parameters(body)
    except Invalid as exc:
        return Verdict("invalid", str(exc))
    reason, fields = _out_of_scope(body)
    return Verdict("out_of_scope", reason, fields) if fields else Verdict("valid")


# --- The corpus -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    line: int  # in requests.jsonl, 1-based
    source: str
    origin: str
    body: dict[str, Any]

    @property
    def from_batch_file(self) -> bool:
        return self.origin.startswith("batch-file")


def chat_samples(model: str) -> Iterator[Sample]:
    """Every chat.completions body of the corpus, its model placeholder replaced by ``model``."""
    for number, text in enumerate(CORPUS.read_text().splitlines(), 1):
        record = json.loads(text)
        if record["endpoint"] != CHAT:
            continue
        body = dict(record["body"])
        if body.get("model") == MODEL_PLACEHOLDER:
            body["model"] = model
        yield Sample(number, record["source"], record["origin"], body)


# The parameters (and message shapes) a body can use, for the per-parameter counts: name -> test on the body.
def _parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for m in body.get("messages") or ()
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict)
    ]


def _roles(body: dict[str, Any]) -> set[Any]:
    return {m.get("role") for m in body.get("messages") or () if isinstance(m, dict)}


FEATURES: dict[str, Any] = {
    **{
        f"response_format {kind}": (
            lambda kind: (
                lambda b: isinstance(b.get("response_format"), dict) and b["response_format"].get("type") == kind  # noqa: B023 (bound by the outer lambda)
            )
        )(kind)
        for kind in ("text", "json_object", "json_schema")
    },
    "tools": lambda b: bool(b.get("tools")),
    "tool_choice": lambda b: b.get("tool_choice") is not None,
    "parallel_tool_calls": lambda b: b.get("parallel_tool_calls") is not None,
    "functions / function_call": lambda b: b.get("functions") is not None or b.get("function_call") is not None,
    "logprobs / top_logprobs": lambda b: b.get("logprobs") is not None or b.get("top_logprobs") is not None,
    "n > 1": lambda b: isinstance(b.get("n"), int) and b["n"] > 1,
    "presence / frequency_penalty": lambda b: any(
        b.get(k) is not None for k in ("presence_penalty", "frequency_penalty")
    ),
    "logit_bias": lambda b: b.get("logit_bias") is not None,
    "stop": lambda b: b.get("stop") is not None,
    "seed": lambda b: b.get("seed") is not None,
    "max_completion_tokens": lambda b: b.get("max_completion_tokens") is not None,
    "max_tokens": lambda b: b.get("max_tokens") is not None,
    "temperature / top_p": lambda b: b.get("temperature") is not None or b.get("top_p") is not None,
    "content as a list of parts": lambda b: bool(_parts(b)),
    "role developer": lambda b: "developer" in _roles(b),
    "role tool": lambda b: "tool" in _roles(b),
    "assistant with tool_calls": lambda b: any(
        isinstance(m, dict) and m.get("tool_calls") for m in b.get("messages") or ()
    ),
    "stream: false": lambda b: b.get("stream") is False,
    "explicit null": lambda b: any(v is None for v in b.values()),
    "no-effect (user, metadata, store, service_tier, prompt_cache_*, safety_identifier, stream_options, "
    "reasoning_effort, verbosity, prediction)": lambda b: any(
        b.get(k) is not None
        for k in (
            "user",
            "metadata",
            "store",
            "service_tier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "prompt_cache_options",
            "safety_identifier",
            "stream_options",
            "reasoning_effort",
            "verbosity",
            "prediction",
        )
    ),
    "vLLM extensions (top_k, min_p, repetition_penalty, chat_template_kwargs)": lambda b: any(
        k in b for k in ("top_k", "min_p", "repetition_penalty", "chat_template_kwargs")
    ),
}
