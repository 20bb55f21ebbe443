"""The messages on the webhook queue: the ``started`` event the worker sends, the ``completed`` notification the
result topic delivers, a batch's end (``batch.completed`` and the other three) from the same topic, and how the
dispatcher reads each."""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from async_inference.batches.models import BatchNotification
from async_inference.jobs import JobStatus
from async_inference.schemas import SCHEMA_VERSION, ChatCompletion, Job, ResultNotification, utcnow

logger = logging.getLogger(__name__)

EVENT_COMPLETED = "completed"
EVENT_STARTED = "started"
# A background response's webhook events, as OpenAI names them (openai-python types/webhooks/response_*_event.py): a
# response's job stores these in its webhook's events, which is how the dispatcher tells a response's webhook apart.
RESPONSE_EVENTS = ("response.completed", "response.failed", "response.cancelled", "response.incomplete")
_RESPONSE_EVENT_OF_STATUS = {
    JobStatus.SUCCEEDED: "response.completed",
    JobStatus.FAILED: "response.failed",
    JobStatus.EXPIRED: "response.failed",  # a response that expired before a worker ran it is failed (responses.py)
    JobStatus.CANCELLED: "response.cancelled",
}


class ResponseWebhookEvent(BaseModel):
    """A background response's webhook body, as OpenAI's webhooks send it: the event, and the response's id only (the
    receiver retrieves the response)."""

    id: str
    object: Literal["event"] = "event"
    type: Literal["response.completed", "response.failed", "response.cancelled", "response.incomplete"]
    created_at: int
    data: dict[str, str]  # {"id": "resp_..."}


def is_response_webhook(events: list[str]) -> bool:
    return any(event in RESPONSE_EVENTS for event in events)


def response_event(event: QueuedEvent) -> QueuedEvent | None:
    """A response's job's ``completed`` notification as the response's webhook event (``response.completed``, or
    ``response.incomplete`` when its output was cut at max_output_tokens, ``response.failed``,
    ``response.cancelled``); None when the notification cannot be read. The event's id is the same on every send."""
    from async_inference.responses import response_id_of  # the Responses module imports this package's neighbours

    try:
        notification = ResultNotification.model_validate_json(event.body)
    except ValidationError:
        return None
    kind = _RESPONSE_EVENT_OF_STATUS.get(notification.status)
    if kind is None:
        return None
    result = notification.result
    if kind == "response.completed" and isinstance(result, ChatCompletion) and result.choices:
        # As GET /v1/responses/{id} says it (responses.output_items): cut at the token limit is incomplete. A result
        # too large to travel inline (over settings.MAX_INLINE_RESULT_BYTES) is told as completed.
        if result.choices[0].finish_reason == "length":
            kind = "response.incomplete"
    finished = notification.timings.finished_at or utcnow()
    body = ResponseWebhookEvent(
        id=f"evt_{notification.job_id.removeprefix('job_')}",
        type=kind,
        created_at=int(finished.timestamp()),
        data={"id": response_id_of(notification.job_id)},
    )
    return QueuedEvent(kind, notification.job_id, body.model_dump_json(), event_id=body.id)


class JobStartedEvent(BaseModel):
    """The body of a ``started`` webhook: sent when a worker starts running the job."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    event: Literal["job.started"] = "job.started"
    job_id: str
    tenant: str
    status: JobStatus
    model: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at: dt.datetime
    started_at: dt.datetime
    attempt: int = Field(description="1 on the first run; higher when the job was redelivered after a worker crash.")

    @classmethod
    def of(cls, job: Job) -> JobStartedEvent:
        return cls(
            job_id=job.job_id,
            tenant=job.tenant,
            status=job.status,
            model=job.model,
            metadata=job.metadata,
            created_at=job.created_at,
            started_at=job.started_at or utcnow(),
            attempt=job.attempts,
        )


def started_event(job: Job, queue: Any) -> bool:
    """Queue the job's ``started`` webhook on its tenant's queue (``queue``: an ``aws.WebhookQueues``) if it asked
    for one; True when queued. The worker calls it after the RUNNING transition.

    Never raises: a started notice is informational and must not cost the job its run.
    """
    if job.webhook is None or EVENT_STARTED not in job.webhook.events:
        return False
    try:
        queue.send(job.tenant, JobStartedEvent.of(job).model_dump_json(exclude_none=True))
    except Exception:
        logger.exception("job %s: could not queue its started webhook", job.job_id)
        return False
    return True


@dataclass(frozen=True)
class QueuedEvent:
    kind: str  # "completed" or "started" for a job; a BATCH_EVENTS name for a batch
    job_id: str  # the job's id, or the batch's
    body: str  # exactly what the receiver gets, and what is signed
    event_id: str | None = None  # a batch event's own id (evt_...), the same on every send

    @property
    def is_batch(self) -> bool:
        return self.kind.startswith("batch.")

    @property
    def msg_id(self) -> str:
        # The same id on every retry and every duplicate: receivers dedupe on webhook-id.
        return self.event_id or f"{self.job_id}_{self.kind}"


def parse_queued(body: str) -> QueuedEvent | None:
    """A message from the webhook queue, or None when it is not one of ours (logged and dropped by the caller)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("Type") == "Notification" and "Message" in data:
        # Raw delivery is off on the subscription: the notification is inside SNS's envelope.
        body = data["Message"]
        try:
            data = json.loads(body)
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    try:
        if data.get("object") == "event" and str(data.get("type", "")).startswith("batch."):
            # The receiver gets OpenAI's webhook event; the batch itself and the tenant stay on the topic.
            batch = BatchNotification.model_validate(data)
            if not batch.data.get("id"):
                return None
            return QueuedEvent(batch.type, batch.data["id"], batch.event().model_dump_json(), event_id=batch.id)
        if data.get("event") == "job.started":
            return QueuedEvent(EVENT_STARTED, JobStartedEvent.model_validate(data).job_id, body)
        return QueuedEvent(EVENT_COMPLETED, ResultNotification.model_validate(data).job_id, body)
    except ValidationError:
        return None
