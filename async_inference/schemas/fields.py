"""What the wire models share: their field types, the refusal of what this deployment cannot do, the unions told
apart by a field's value or a value's shape, and how a validation error names the field to fix."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
)
from pydantic_core import PydanticCustomError

from async_inference import settings
from async_inference.schema_patterns import unsupported_patterns
from async_inference_client.models.base import StrictModel

MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=settings.MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, StringConstraints(max_length=settings.MAX_METADATA_VALUE_CHARS)]
Text = Annotated[str, StringConstraints(max_length=settings.MAX_UPLOAD_BYTES)]


def refuse(code: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(code, message)


TEXT_ONLY = "this deployment serves a text-only model"


# Unions pick their branch with a callable discriminator, so that an error is the chosen branch's (``content.1.text:
# Field required``), not one error per branch. Its tags start with TAG_MARK; error_location() leaves them out.
TAG_MARK = "~"


def by_type(*members: type[BaseModel], field: str) -> Any:
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


def shape(value: Any) -> str | None:
    """The tag of a value that is a string, a list or an object (a dict, or a model when serializing)."""
    if isinstance(value, str):
        return TAG_MARK + "str"
    if isinstance(value, list):
        return TAG_MARK + "list"
    return TAG_MARK + "object" if isinstance(value, (dict, BaseModel)) else None


FunctionName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


def _patterns_the_grammar_takes(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema the engines compile into a grammar: a ``pattern`` the grammar library cannot honour is refused here,
    named by its path in the schema, rather than failing the job later (``async_inference.schema_patterns``)."""
    for path, why in unsupported_patterns(schema):
        raise field_error(path, f"{why} (a limit of this deployment's structured outputs)")
    return schema


JSONSchemaObject = Annotated[dict[str, Any], AfterValidator(_patterns_the_grammar_takes)]


HOSTED_TOOLS = {
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


ToolMode = Literal["none", "auto", "required"]


def tool_choice(named: type[BaseModel], check: Callable[[Any], Any], named_form: str) -> Any:
    """A ``tool_choice`` parameter: a mode, or ``named``, the object naming the function to call (``named_form`` as
    the error writes it), whose other kinds ``check`` refuses by name."""
    return Annotated[
        Annotated[ToolMode, Tag(TAG_MARK + "str")] | Annotated[named, BeforeValidator(check), Tag(TAG_MARK + "object")],
        Discriminator(
            shape,
            custom_error_type="tool_choice_type",
            custom_error_message=f"tool_choice must be 'none', 'auto', 'required' or {named_form}",
        ),
    ]


class StreamOptions(StrictModel):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class PromptCacheOptions(StrictModel):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


def _deployment_limit(limit: int, message: str) -> Any:
    """At most ``limit``, a limit of this deployment rather than of OpenAI's API: the error says so and what to do.
    The JSON Schema says ``maximum`` as a ``le`` would."""

    def check(value: int) -> int:
        if value > limit:
            raise refuse("deployment_limit", f"{value} is more than {message}")
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


def field_error(field_name: str, message: str) -> PydanticCustomError:
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
