"""What a chat.completions request asks of an engine, read once from its OpenAI body.

The engines read the request as the OpenAI body it is (``request.model_dump()``: the schema's attribute names are
OpenAI's field names), so this module is the one place that knows OpenAI's parameter semantics: the legacy
``functions`` / ``function_call`` become ``tools`` / ``tool_choice``, ``max_completion_tokens`` is ``max_tokens``,
``tool_choice`` is resolved to "no tools", "the model decides", "some call" or "this function", and
``response_format`` to a JSON schema (``json_object`` is ``{"type": "object"}``) or none.

It also renders the messages for a chat template that knows only strings (SmolLM2's, and any template without tool
support), the way Qwen2.5's template and vLLM's ``hermes`` tool parser expect tool calls to look:

- content given as a list of text parts is joined with newlines (as vLLM does for string-only templates);
- ``developer`` is ``system`` (what it means for a model without OpenAI's instruction hierarchy);
- an assistant turn's ``tool_calls`` are ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks after its
  text; a ``tool`` message is a ``user`` turn holding ``<tool_response>...</tool_response>``;
- the tools offered are described in a system turn (``<tools>`` with one JSON function signature a line, and how to
  answer with ``<tool_call>``), merged into the first system message when there is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.base import PermanentEngineError
from gpu_worker.engines.schema_budget import check_schema

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{signatures}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict[str, Any]  # a JSON schema; {} (anything) when the tool declares none

    def signature(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Asks:
    """The request's parameters in engine terms; defaults are OpenAI's."""

    messages: list[dict[str, Any]]
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # vLLM's extension; None or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: dict[str, Any] | None = None  # response_format json_object / json_schema
    tools: list[Function] = field(default_factory=list)  # offered to the model (none when tool_choice is "none")
    tool_choice: str = "none"  # "none" | "auto" | "required" | "function" (forced_function names it)
    forced_function: str | None = None
    parallel_tool_calls: bool = True
    legacy_functions: bool = False  # the request used ``functions``: the answer is ``function_call``
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def forces_tool_call(self) -> bool:
        return self.tool_choice in ("required", "function")

    @property
    def constrained(self) -> bool:
        """Whether the output is grammar-constrained (structured output or a forced tool call)."""
        return self.json_schema is not None or self.forces_tool_call

    def function(self, name: str) -> Function | None:
        return next((f for f in self.tools if f.name == name), None)

    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema the whole output must validate against, or None for free text.

        As vLLM builds it for forced tool calls: a named function's output is its arguments object; ``required`` is
        an array of ``{"name", "parameters"}`` objects, one per call (at most one without parallel_tool_calls)."""
        if self.tool_choice == "function":
            assert self.forced_function is not None
            return self.function(self.forced_function).parameters or {"type": "object"}  # type: ignore[union-attr]
        if self.tool_choice == "required":
            calls = {
                "type": "array",
                "minItems": 1,
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "enum": [f.name]},
                                "parameters": f.parameters or {"type": "object"},
                            },
                            "required": ["name", "parameters"],
                        }
                        for f in self.tools
                    ]
                },
            }
            if not self.parallel_tool_calls:
                calls["maxItems"] = 1
            return calls
        return self.json_schema


def _get(body: dict[str, Any], key: str, default: Any) -> Any:
    value = body.get(key)
    return default if value is None else value


def _function(spec: dict[str, Any]) -> Function:
    return Function(name=spec["name"], description=spec.get("description"), parameters=spec.get("parameters") or {})


def asks_of(request: ChatCompletionRequest) -> Asks:
    """Read ``request``; a combination no engine can honour, or an output schema over the grammar's budget
    (``gpu_worker.engines.schema_budget``), is a ``PermanentEngineError`` naming the field."""
    body = request.model_dump(mode="json", exclude_none=True)
    legacy = "functions" in body and "tools" not in body
    if legacy:
        tools = [_function(f) for f in body["functions"]]
        choice = body.get("function_call", "auto" if tools else "none")
        tool_choice = {"type": "function", "function": choice} if isinstance(choice, dict) else choice
    else:
        tools = [_function(t["function"]) for t in body.get("tools", []) if t.get("type", "function") == "function"]
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
    forced = None
    if isinstance(tool_choice, dict):
        forced = tool_choice.get("function", {}).get("name") or tool_choice.get("name")
        if not any(f.name == forced for f in tools):
            raise PermanentEngineError(
                f"{'function_call' if legacy else 'tool_choice'} names {forced!r}, which is not among the "
                f"{'functions' if legacy else 'tools'}: name one of {[f.name for f in tools]}"
            )
        tool_choice = "function"
    if tool_choice != "none" and not tools:
        raise PermanentEngineError(f"tool_choice {tool_choice!r} needs tools: add tools or drop tool_choice")
    if tool_choice == "none":
        tools = []

    response_format = body.get("response_format") or {"type": "text"}
    schema = None
    if response_format.get("type") == "json_object":
        schema = {"type": "object"}
    elif response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema") or {"type": "object"}
    if schema is not None and tool_choice in ("required", "function"):
        raise PermanentEngineError(
            "response_format and a forced tool_choice both constrain the whole output: use one of them"
        )

    stop = body.get("stop") or []
    try:
        logit_bias = {int(k): float(v) for k, v in (body.get("logit_bias") or {}).items()}
    except ValueError as exc:
        raise PermanentEngineError(f"logit_bias keys are token ids (integers as strings): {exc}") from exc
    logprobs = bool(body.get("logprobs"))
    asks = Asks(
        messages=body["messages"],
        max_tokens=_get(body, "max_completion_tokens", _get(body, "max_tokens", request.max_tokens)),
        n=_get(body, "n", 1),
        temperature=_get(body, "temperature", 1.0),
        top_p=_get(body, "top_p", 1.0),
        top_k=body.get("top_k") if body.get("top_k", -1) not in (-1, 0) else None,
        min_p=_get(body, "min_p", 0.0),
        seed=body.get("seed"),
        stop=[stop] if isinstance(stop, str) else list(stop),
        presence_penalty=_get(body, "presence_penalty", 0.0),
        frequency_penalty=_get(body, "frequency_penalty", 0.0),
        repetition_penalty=_get(body, "repetition_penalty", 1.0),
        logit_bias=logit_bias,
        logprobs=logprobs,
        top_logprobs=_get(body, "top_logprobs", 0) if logprobs else 0,
        json_schema=schema,
        tools=tools,
        tool_choice=tool_choice,
        forced_function=forced,
        parallel_tool_calls=_get(body, "parallel_tool_calls", True),
        legacy_functions=legacy,
        chat_template_kwargs=body.get("chat_template_kwargs") or {},
    )
    output_schema = asks.output_schema()
    if output_schema is not None:
        check_schema(output_schema, "tools[].function.parameters" if asks.forces_tool_call else "response_format")
    return asks


def refuse_beyond_text(asks: Asks, engine: str) -> None:
    """For the test engines, which answer with words of the prompt: refuse what would make that answer wrong (a
    JSON format, a forced tool call, logprobs of a model), naming the parameter."""
    for asked, name in (
        (asks.json_schema is not None, "response_format"),
        (asks.forces_tool_call, "tool_choice"),
        (asks.logprobs, "logprobs"),
    ):
        if asked:
            raise PermanentEngineError(
                f"the {engine} engine cannot honour {name}: it only repeats the prompt's words; use ENGINE=cpu or vllm"
            )


def last_user_text(asks: Asks) -> str:
    return next((text_of(m.get("content")) for m in reversed(asks.messages) if m["role"] == "user"), "")


# --- Messages for a chat template that knows only strings -----------------------------------------------------------


def text_of(content: Any) -> str:
    """A message's content as one string: text parts joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content if part.get("type", "text") == "text")


def _call_block(name: str, arguments: Any) -> str:
    call = json.dumps({"name": name, "arguments": _arguments(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}"


def plain_messages(asks: Asks) -> list[dict[str, str]]:
    """``asks.messages`` as role/content strings, tools and tool calls written out as described above."""
    out: list[dict[str, str]] = []
    for message in asks.messages:
        role, text = message["role"], text_of(message.get("content"))
        if role == "developer":
            role = "system"
        if role == "assistant":
            calls = [c["function"] for c in message.get("tool_calls") or []]
            if message.get("function_call"):
                calls.append(message["function_call"])
            text = "\n".join([text] * bool(text) + [_call_block(c["name"], c.get("arguments")) for c in calls])
        elif role in ("tool", "function"):
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if asks.tools:
        signatures = "\n".join(json.dumps(f.signature()) for f in asks.tools)
        tools_text = TOOLS_PROMPT.format(signatures=signatures)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_text}"}
        else:
            out.insert(0, {"role": "system", "content": tools_text})
    return out


def parse_tool_calls(text: str, asks: Asks) -> tuple[str | None, list[tuple[str, str]]]:
    """A free-text answer (tool_choice ``auto``) split into its text and its calls, as vLLM's ``hermes`` parser does:
    each ``<tool_call>`` block holding ``{"name": ..., "arguments": {...}}`` for an offered function is a call (its
    arguments re-serialised as JSON text); the text is what comes before the first block. A block that does not parse
    or names no offered function leaves the whole answer as text."""
    if TOOL_CALL_OPEN not in text:
        return text, []
    calls: list[tuple[str, str]] = []
    rest = text.split(TOOL_CALL_OPEN)
    for block in rest[1:]:
        body = block.split(TOOL_CALL_CLOSE, 1)[0].strip()
        try:
            call = json.loads(body)
            name, arguments = call["name"], call.get("arguments", call.get("parameters", {}))
        except (ValueError, KeyError, TypeError):
            return text, []
        if asks.function(name) is None or not isinstance(arguments, dict):
            return text, []
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    if not asks.parallel_tool_calls:
        calls = calls[:1]
    before = rest[0].strip()
    return before or None, calls


def template_messages(asks: Asks) -> list[dict[str, Any]]:
    """``asks.messages`` for a chat template that takes tools: text parts joined, ``developer`` as ``system``, and
    tool-call arguments as objects (Hugging Face templates serialise them themselves)."""
    out: list[dict[str, Any]] = []
    for message in asks.messages:
        message = {**message, "content": text_of(message.get("content"))}
        if message["role"] == "developer":
            message["role"] = "system"
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
