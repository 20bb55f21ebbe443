"""What a client submits to ``POST /v1/jobs``: the request (a chat.completions, embeddings or completions body) and how
it reaches the service (inline, or a presigned upload), with its metadata, webhook, lifetime and priority."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, StringConstraints, Tag, ValidationError, model_validator

from async_inference import settings
from async_inference.schemas.chat import CHAT_ENDPOINT, ChatCompletionRequest
from async_inference.schemas.completions import COMPLETIONS_ENDPOINT, CompletionRequest
from async_inference.schemas.embeddings import EMBEDDINGS_ENDPOINT, EmbeddingRequest
from async_inference.schemas.fields import (
    TAG_MARK,
    MetadataKey,
    MetadataValue,
    error_location,
    error_message,
    field_error,
)
from async_inference_client.models.base import StrictModel
from async_inference_client.models.jobs import JobPriority


class UploadSpec(StrictModel):
    size_bytes: int = Field(ge=1, le=settings.MAX_UPLOAD_BYTES, description="Exact size of the body you will PUT.")


class WebhookSpec(StrictModel):
    url: Annotated[str, StringConstraints(min_length=8, max_length=2048)]
    events: list[Literal["completed", "started"]] = Field(default_factory=lambda: ["completed"], min_length=1)


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


class JobSubmission(StrictModel):
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
        try:
            # to_chat() validates the chat request it makes, whose limits (4 stop sequences) a completion's may pass.
            completion = CompletionRequest.model_validate(data["request"]).to_chat()
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            location = error_location(first)
            field = "request" if location == "(body)" else f"request.{location}"
            raise field_error(field, error_message(first)) from None
        return {**data, "request": completion}

    @model_validator(mode="after")
    def _exactly_one_source(self) -> JobSubmission:
        if (self.request is None) == (self.upload is None):
            raise ValueError(
                "give exactly one of 'request' (the chat.completions body) or 'upload' ({'size_bytes': N})"
            )
        embeddings = self.endpoint == EMBEDDINGS_ENDPOINT
        if self.endpoint != CHAT_ENDPOINT and self.upload is not None:
            raise field_error("upload", f"a job for {self.endpoint} takes its request inline: send it as 'request'")
        if self.request is not None and embeddings != isinstance(self.request, EmbeddingRequest):
            wanted = "an embeddings body (model, input)" if embeddings else "a chat.completions body (model, messages)"
            raise field_error("request", f"endpoint {self.endpoint} takes {wanted}")
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
