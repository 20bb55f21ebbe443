"""The messages of a chat request: their roles, content (text and refusal parts; any other kind is refused by name)
and tool calls, with the rules that differ by role."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, StringConstraints, Tag, model_validator

from async_inference import settings
from async_inference.schemas.fields import TAG_MARK, TEXT_ONLY, Text, by_type, refuse, shape
from async_inference_client.models.base import StrictModel


class PromptCacheBreakpoint(StrictModel):
    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


class TextPart(StrictModel):
    type: Literal["text"]
    text: Text
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None  # a caching hint: no effect here


class RefusalPart(StrictModel):
    """An assistant message's refusal, sent back in the conversation history."""

    type: Literal["refusal"]
    refusal: Text


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
        raise refuse(
            "unsupported_content",
            f"this {kind!r} part ({_NON_TEXT_PARTS[kind]}) cannot be read: "
            f"{TEXT_ONLY}; send text parts only (describe or transcribe the input as text)",
        )
    return value


ContentPart = Annotated[by_type(TextPart, RefusalPart, field="a content part"), BeforeValidator(_text_only_part)]


# A string, or a list of parts.
Content = Annotated[
    Annotated[Text, Tag(TAG_MARK + "str")]
    | Annotated[list[ContentPart], Field(max_length=settings.MAX_CONTENT_PARTS), Tag(TAG_MARK + "list")],
    Discriminator(
        shape,
        custom_error_type="content_type",
        custom_error_message="content must be a string or a list of content parts",
    ),
]


MessageName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class FunctionCall(StrictModel):
    """A function the assistant called: its name and its arguments, a JSON text (as the model wrote it)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    arguments: Text


def _function_tool_call(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") not in (None, "function"):
        raise refuse(
            "unsupported_tool_call",
            f"a {value.get('type')!r} tool call: only function tool calls are "
            "supported (the request's tools are function tools)",
        )
    return value


class ToolCall(StrictModel):
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    type: Literal["function"]
    function: FunctionCall


def _no_audio(value: Any) -> Any:
    if value is not None:
        raise refuse(
            "unsupported_parameter", f"audio cannot be referred to: {TEXT_ONLY}; send the assistant's words as content"
        )
    return value


MessageRole = Literal["developer", "system", "user", "assistant", "tool", "function"]


class ChatMessage(StrictModel):
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
    refusal: Text | None = None
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
