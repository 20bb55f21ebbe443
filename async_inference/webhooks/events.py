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
from async_inference.schemas import SCHEMA_VERSION, Job, ResultNotification, utcnow

logger = logging.getLogger(__name__)

EVENT_COMPLETED = "completed"
EVENT_STARTED = "started"


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
    """Queue the job's ``started`` webhook on ``queue`` (an ``aws.WebhookQueue``) if it asked for one; True when
    queued. The worker calls it after the RUNNING transition.

    Never raises: a started notice is informational and must not cost the job its run.
    """
    if job.webhook is None or EVENT_STARTED not in job.webhook.events:
        return False
    try:
        queue.send(JobStartedEvent.of(job).model_dump_json(exclude_none=True))
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
