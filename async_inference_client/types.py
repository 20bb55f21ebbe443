"""The client's public types besides the wire models: what a request body and a webhook may be, what ``wait()``
reports, and the options each operation takes (typed keyword arguments of both clients, written once)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from pydantic import BaseModel

from async_inference_client.models.batches import Batch
from async_inference_client.models.jobs import JobEvent, JobProgress, JobStatus, JobView
from async_inference_client.retry import Backoff

# What a request body may be: a JSON object as a mapping, or a pydantic model of one (the server's request models are
# not shipped with the client; any model dumps the same way).
RequestBody = Mapping[str, Any] | BaseModel
Webhook = Mapping[str, Any] | BaseModel | str


# --- What wait() reports --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobUpdate:
    """What ``wait()`` passes to ``on_update`` each time it learns something about the job.

    ``via`` says how: "poll" (a GET; ``job`` is the view it returned) or "push" (a WebSocket event). ``progress`` is a
    running job's tokens generated so far (``{completion_tokens, updated_at}``), when the server reports it; there is
    no fraction done, since ``max_tokens`` is a cap, not the length the job will reach."""

    job_id: str
    status: JobStatus
    progress: JobProgress | None = None
    via: Literal["poll", "push"] = "poll"
    job: JobView | None = None

    @classmethod
    def of_view(cls, job: JobView) -> JobUpdate:
        return cls(job_id=job.job_id, status=job.status, progress=job.progress, job=job)

    @classmethod
    def of_event(cls, event: JobEvent) -> JobUpdate:
        return cls(job_id=event.job_id, status=event.status, progress=event.progress, via="push")


OnUpdate = Callable[[JobUpdate], None]


# --- The options of the operations: written once, taken by both clients as typed keywords ----------------------------


class SubmitOptions(TypedDict, total=False):
    """What ``submit()`` and ``submit_upload()`` take besides the body."""

    metadata: Mapping[str, str]
    webhook: Webhook  # a URL, or {"url": ..., "events": [...]}: the job's end is POSTed there, signed
    idempotency_key: str  # the same key again returns the same job
    ttl_seconds: int  # still queued after this: the job expires
    timeout_seconds: int  # a running generation is aborted after this
    priority: Literal["interactive", "batch"]
    endpoint: Literal["/v1/chat/completions", "/v1/embeddings"]  # the body's OpenAI endpoint (default chat)


class ListOptions(TypedDict, total=False):
    """``list()``'s filters and page: pass the page's ``.next`` as ``next_token`` for the following one."""

    status: JobStatus | str
    limit: int
    next_token: str


class WaitOptions(TypedDict, total=False):
    """``wait()``: give up after ``timeout_s`` (600); ``on_update`` gets each JobUpdate; ``poll`` replaces the
    client's schedule."""

    timeout_s: float
    on_update: OnUpdate
    poll: Backoff


class BatchOptions(TypedDict, total=False):
    """``create_batch()``: ``webhook`` (a URL, or ``{"url", "events"}``) is told the batch's end, as OpenAI's webhook
    event, signed with the tenant's secret."""

    metadata: Mapping[str, str]
    completion_window: str  # "24h", the one OpenAI accepts
    webhook: Webhook


class BatchWaitOptions(TypedDict, total=False):
    """``wait_batch()``: give up after ``timeout_s`` (24 h); ``on_update`` gets every view (request_counts for a
    progress bar); ``poll`` replaces the client's schedule."""

    timeout_s: float
    on_update: Callable[[Batch], None]
    poll: Backoff
