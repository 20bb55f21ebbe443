"""The dispatcher: one message on the webhook queue becomes one signed delivery, recorded on its job.

``dispatch`` is safe to call from several threads at once (the dispatcher Lambda delivers a whole batch at once):
the only state it keeps between calls is which receivers, and which tenants' receivers, held an attempt to its deadline
(``async_inference.webhooks.slow_receivers``), and its store and secrets are shared read-mostly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from async_inference import settings
from async_inference.batches.models import BatchRecord
from async_inference.schemas import Job, WebhookAttempt, utcnow
from async_inference.webhooks.backoff import Backoff
from async_inference.webhooks.delivery import MAX_ERROR_CHARS, Poster, PostResult, post
from async_inference.webhooks.events import (
    EVENT_COMPLETED,
    QueuedEvent,
    is_response_webhook,
    parse_queued,
    response_event,
)
from async_inference.webhooks.secrets import TenantSecrets
from async_inference.webhooks.signing import signed_headers
from async_inference.webhooks.slow_receivers import SlowReceivers
from async_inference.webhooks.url_safety import Resolver, UnsafeUrl, check_url, resolve

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What became of one queued event: done (delivered, or nothing to deliver), or retry after ``retry_in_s``."""

    done: bool
    retry_in_s: int = 0
    reason: str = ""
    job_id: str | None = None


class Dispatcher:
    """Delivers queued events to the URLs their jobs (or batches) asked for and records every attempt on the job (or
    the batch)."""

    def __init__(
        self,
        *,
        store: Any,  # aws.JobStore
        secrets: TenantSecrets,
        batches: Any | None = None,  # batches.store.BatchStore; None: batch events are dropped (no batch table)
        allow_local: bool = False,
        backoff: Backoff | None = None,
        max_receives: int = settings.WEBHOOK_MAX_RECEIVE_COUNT,
        resolver: Resolver = resolve,
        poster: Poster = post,
        slow_receivers: SlowReceivers | None = None,
        slow_tenants: SlowReceivers | None = None,
    ) -> None:
        self.store = store
        self.batches = batches
        self.secrets = secrets
        self.allow_local = allow_local
        self.backoff = backoff or Backoff()
        self.max_receives = max_receives
        self._resolver = resolver
        self._post = poster
        self.slow_receivers = slow_receivers or SlowReceivers()
        # By tenant as well as by receiver: a tenant's receivers are as many hosts and ports as it names, and each
        # new one would hold a batch, and the batches behind it, for a whole deadline.
        self.slow_tenants = slow_tenants or SlowReceivers()

    def dispatch(self, body: str, receive_count: int) -> Outcome:
        event = parse_queued(body)
        if event is None:
            logger.error("dropping a message that is not a job event")
            return Outcome(done=True, reason="not a job event")
        # A batch's webhook is delivered, and its attempts recorded, exactly as a job's: only the record differs.
        store = self.batches if event.is_batch else self.store
        if store is None:
            logger.error("dropping a batch event: this dispatcher has no batch table")
            return Outcome(done=True, reason="no batch table", job_id=event.job_id)
        job = store.get_batch(event.job_id) if event.is_batch else store.get(event.job_id)
        if job is not None and job.webhook is not None and event.kind == EVENT_COMPLETED:
            if is_response_webhook(job.webhook.events):
                # A background response's end is told as OpenAI's response.* webhook event.
                event = response_event(event) or event
        if job is None or job.webhook is None or event.kind not in job.webhook.events:
            return Outcome(done=True, reason="no webhook for this event", job_id=event.job_id)
        decides_status = event.kind == EVENT_COMPLETED or EVENT_COMPLETED not in job.webhook.events
        if decides_status and job.webhook.status == "delivered":
            return Outcome(done=True, reason="delivered already", job_id=event.job_id)  # a duplicate notification

        result = self._attempt(job, event)
        last = receive_count >= self.max_receives
        status = None
        if decides_status and (result.delivered or last):
            status = "delivered" if result.delivered else "failed"
        error = result.error or (None if result.delivered else f"HTTP {result.status_code}")
        attempt = WebhookAttempt(
            at=utcnow(), event=event.kind, receive_count=receive_count, status_code=result.status_code, error=error
        )
        store.record_webhook_attempt(event.job_id, attempt.model_dump(mode="json", exclude_none=True), status=status)
        if result.delivered:
            return Outcome(done=True, reason="delivered", job_id=event.job_id)
        # After the last receive the message is not hidden: the next receive moves it to the DLQ.
        retry_in_s = 0 if last else self.backoff.delay_s(receive_count)
        return Outcome(done=False, retry_in_s=retry_in_s, reason=error or "", job_id=event.job_id)

    def _attempt(self, job: Job | BatchRecord, event: QueuedEvent) -> PostResult:
        assert job.webhook is not None
        try:
            target = check_url(job.webhook.url, allow_local=self.allow_local, resolver=self._resolver)
        except UnsafeUrl as exc:
            return PostResult(status_code=None, error=f"refused: {exc}"[:MAX_ERROR_CHARS])
        try:
            headers = signed_headers(self.secrets.for_tenant(job.tenant), event.msg_id, event.body)
        except KeyError as exc:
            logger.error("cannot sign webhook for tenant %s: %s", job.tenant, exc)
            return PostResult(status_code=None, error="the service has no signing secret for this tenant")
        receiver = f"{target.host}:{target.port}"
        if paused := self.slow_receivers.paused(receiver):
            return PostResult(
                status_code=None,
                error=f"not attempted: this receiver's last delivery reached the deadline; paused {paused:.0f} s more",
            )
        if paused := self.slow_tenants.paused(job.tenant):
            return PostResult(
                status_code=None,
                error="not attempted: a delivery to another receiver of this tenant reached the deadline; paused "
                f"{paused:.0f} s more",
            )
        result = self._post(target, headers, event.body.encode())
        if result.timed_out:
            self.slow_receivers.slow(receiver)
            self.slow_tenants.slow(job.tenant)
        return result
