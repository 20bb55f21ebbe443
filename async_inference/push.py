"""The WebSocket API's logic: who may connect, what a subscription holds, and which connections each job event reaches.

The routes' function (``lambdas/websocket``: $connect, $disconnect, subscribe, $default), the push function
(``lambdas/push/handler.py``, subscribed to the result topic and the job event topic) and the delta push function
(``lambdas/push/deltas.py``, fed by the job event log's stream: a streamed job's text as it decodes) are thin adapters
over this module; AWS is reached only through the adapters of ``async_inference.aws`` they hand in.

Tenant isolation: a connection belongs to the tenant of the API key it connected with, and an event is only ever
posted to connections of the event's own tenant (``ConnectionStore.subscribers`` reads that tenant's connections and
no other's); ``all: true`` is all of the connection's tenant's jobs. Subscribing to another tenant's job id is
accepted and tells nothing, exactly like subscribing to an id that does not exist.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from async_inference import settings
from async_inference.authorizer import TenantKeys, key_hash, presented_keys
from async_inference.aws import ApiKeyValues, ConnectionPoster, ConnectionStore, TooManySubscriptions
from async_inference.batches.models import BatchNotification
from async_inference.config import PushSettings
from async_inference.jobs_service import describe_validation_error
from async_inference.schemas import (
    FINAL_EVENT_TYPES,
    BatchEvent,
    JobActivity,
    JobEvent,
    ResultNotification,
    Subscription,
)
from async_inference.streaming import log
from async_inference.streaming.log import EventLog, Segment

logger = logging.getLogger(__name__)


# --- The routes -----------------------------------------------------------------------------------------------------


def api_key_of(headers: Mapping[str, str] | None, query: Mapping[str, str] | None) -> str | None:
    """The key a client connected with: the ``x-api-key`` header (or ``Authorization: Bearer``, as the REST API takes
    it), or else the ``api_key`` query parameter (a browser's WebSocket cannot set headers)."""
    presented = presented_keys(headers)
    return presented[0] if presented else (query or {}).get(settings.WS_API_KEY_QUERY_PARAMETER) or None


def reply(type_: str, **fields: Any) -> str:
    """A message the API sends back on the connection (not a job event: clients that follow jobs ignore it)."""
    return json.dumps({"type": type_, **fields})


def error_reply(code: str, message: str) -> str:
    return reply("error", code=code, message=message)


# The missed deltas one subscribe reply carries at most (their JSON): API Gateway's WebSocket messages are at most
# 128 KB, and the reply has its own fields. The client subscribes again after the last for the rest ("more").
MAX_MISSED_BYTES = 96 * 1024


class WebSocketRoutes:
    """What each route does with its connection; ``log``: the job event log, to answer ``starting_after``."""

    def __init__(self, connections: ConnectionStore, tenants: TenantKeys, log: EventLog | None = None) -> None:
        self.connections = connections
        self.tenants = tenants
        self.log = log

    def connect(
        self, connection_id: str, headers: Mapping[str, str] | None, query: Mapping[str, str] | None
    ) -> str | None:
        """Open the connection for its key's tenant; None (refuse it) for a missing or unknown key."""
        key = api_key_of(headers, query)
        tenant = self.tenants.tenant_of(key) if key else None
        if tenant is None or key is None:
            return None
        self.connections.open(connection_id, tenant, key_hash(key))
        return tenant

    def disconnect(self, connection_id: str) -> None:
        self.connections.close(connection_id)

    def subscribe(self, connection_id: str, body: str | None) -> str:
        """Add a subscription to the connection; the reply says what was subscribed, or what to fix."""
        try:
            subscription = Subscription.model_validate_json(body or "")
        except ValidationError as exc:
            message, _ = describe_validation_error(exc)
            return error_reply("invalid_subscription", message)
        try:
            if not self.connections.subscribe(connection_id, subscription):
                return error_reply("gone", "the connection is closed: connect again")
        except TooManySubscriptions as exc:
            return error_reply("too_many_subscriptions", str(exc))
        scope = subscription.model_dump(mode="json", exclude_none=True, exclude={"action"})
        if subscription.starting_after is None or subscription.job_ids is None:
            return reply("subscribed", **scope)
        # Read after the subscription is stored: a segment written since is pushed, one written before is read here.
        missed, more = self.missed(connection_id, subscription.job_ids[0], subscription.starting_after)
        return reply("subscribed", **scope, missed=missed, more=more)

    def missed(self, connection_id: str, job_id: str, after: int) -> tuple[list[dict[str, Any]], bool]:
        """The job's deltas after ``after`` as ``job.delta`` messages, oldest first, up to ``MAX_MISSED_BYTES``; and
        whether more remain. Nothing of another tenant's job: its log reads as empty, as an unknown job's."""
        tenant = self.connections.tenant_of(connection_id)
        if self.log is None or tenant is None:
            return [], False
        missed: list[dict[str, Any]] = []
        size = 0
        while True:
            segments = self.log.after(job_id, after, tenant=tenant)
            for segment in segments:
                message = JobDelta(job_id=job_id, **segment.model_dump()).model_dump(mode="json", exclude_none=True)
                size += len(json.dumps(message))
                if size > MAX_MISSED_BYTES and missed:
                    return missed, True
                missed.append(message)
                after = segment.seq
            if not segments:
                return missed, False

    @staticmethod
    def default(body: str | None) -> str:
        """Any message no route takes."""
        example = json.dumps({"action": settings.WS_ROUTE_SUBSCRIBE, "job_ids": ["job_..."]})
        return error_reply("unknown_action", f'send {example} (or "batch_id": ..., or "all": true)')


# --- Pushing events -------------------------------------------------------------------------------------------------


class JobDelta(Segment):
    """A message the WebSocket API pushes to a connection that follows a streamed job: one segment of its event log,
    as the worker wrote it (``async_inference.streaming.log.Segment``): its ``seq``, the text each choice gained since
    the previous one, the completion tokens so far, and in the last one the run's ``end``."""

    type: Literal["job.delta"] = "job.delta"
    job_id: str


@dataclass(frozen=True)
class Pushed:
    """A job event and the tenant whose connections may be told."""

    tenant: str
    event: JobEvent | BatchEvent | JobDelta


def event_of(message: str, attributes: Mapping[str, str]) -> Pushed | None:
    """The job event in a message of the result topic or the job event topic (told apart by its ``event``
    attribute); None for a message that is not one (the push function's filter policies keep those away)."""
    kind = attributes.get(settings.EVENT_ATTRIBUTE)
    if kind == settings.RESULT_EVENT:
        note = ResultNotification.model_validate_json(message)
        final = FINAL_EVENT_TYPES.get(note.status)
        return Pushed(note.tenant, JobEvent(type=final, job_id=note.job_id, error=note.error)) if final else None
    if kind in settings.ACTIVITY_EVENTS:
        activity = JobActivity.model_validate_json(message)
        return Pushed(
            activity.tenant, JobEvent(type=activity.event, job_id=activity.job_id, progress=activity.progress)
        )
    if kind in settings.BATCH_RESULT_EVENTS:
        ended = BatchNotification.model_validate_json(message)
        counts = ended.batch.request_counts
        return Pushed(
            ended.tenant,
            BatchEvent(
                type=ended.type,
                batch_id=ended.batch.id,
                status=ended.batch.status.value,
                request_counts=counts.model_dump() if counts else None,
            ),
        )
    return None


def delta_of(image: Mapping[str, Any]) -> Pushed | None:
    """The ``job.delta`` in an item of the job event log (a stream record's new image, deserialized); None for an item
    without the job's tenant (written by a worker that did not record it: nobody can be told)."""
    tenant, job_id, body = (image.get(name) for name in (log.TENANT_ATTRIBUTE, log.PARTITION_KEY, log.BODY_ATTRIBUTE))
    if not (tenant and job_id and body):
        return None
    fields = {**json.loads(body), "seq": int(image[log.SORT_KEY]), "job_id": job_id}
    return Pushed(str(tenant), JobDelta.model_validate(fields))


@dataclass
class PushOutcome:
    sent: int = 0
    gone: int = 0  # closed connections, now deleted
    failed: int = 0  # posts that failed otherwise (throttled, ...): logged, not retried
    revoked: int = 0  # connections opened with a key since disabled or deleted: closed, told nothing


class Pusher:
    """Posts each event to the connections of its tenant that subscribed to its job, and forgets gone ones.

    With ``keys``, a connection opened with a key that has since been disabled or deleted (as of at most
    ``authorizer.KEYS_TTL_S`` ago) is closed instead of told: a revoked key receives no event past that bound, and its
    connection ends at its tenant's next event (an idle one at API Gateway's idle timeout)."""

    def __init__(self, connections: ConnectionStore, poster: ConnectionPoster, keys: TenantKeys | None = None) -> None:
        self.connections = connections
        self.poster = poster
        self.keys = keys

    @classmethod
    def from_settings(cls, config: PushSettings) -> Pusher:
        """The push functions' pusher: the stack's connections and stage, and the key lookup of ``$connect``, so that a
        connection whose key was revoked is closed rather than told."""
        keys = TenantKeys(config.tenant_api_key_ids, ApiKeyValues()) if config.tenant_api_key_ids else None
        return cls(
            ConnectionStore(config.connections_table_name), ConnectionPoster(config.websocket_callback_url), keys
        )

    def push(self, pushed: Pushed) -> PushOutcome:
        return self.push_all([pushed])

    def push_all(self, pushed: Sequence[Pushed]) -> PushOutcome:
        """Each event to the connections that follow its job or batch, in the order given; the followers of a job are
        read once for all of its events (a stream batch holds several segments of a job)."""
        outcome = PushOutcome()
        scopes: dict[tuple[str, str, str], list[bytes]] = {}
        for one in pushed:
            event = one.event
            scope = ("batch_id", event.batch_id) if isinstance(event, BatchEvent) else ("job_id", event.job_id)
            scopes.setdefault((one.tenant, *scope), []).append(event.model_dump_json(exclude_none=True).encode())
        for (tenant, kind, scope_id), messages in scopes.items():
            self._tell(tenant, self.connections.followers(tenant, **{kind: scope_id}), messages, outcome)
        return outcome

    def _tell(
        self, tenant: str, followers: list[tuple[str, str | None]], messages: list[bytes], outcome: PushOutcome
    ) -> None:
        for connection_id, hashed in followers:
            if self.keys is not None and hashed is not None and not self.keys.holds(tenant, hashed):
                self.poster.disconnect(connection_id)
                self.connections.close(connection_id)
                outcome.revoked += 1
                continue
            for data in messages:
                try:
                    if not self.poster.post(connection_id, data):
                        outcome.gone += 1
                        self.connections.close(connection_id)
                        break
                    outcome.sent += 1
                except Exception:
                    # One slow or throttled connection must not cost the others their event, nor send it to them
                    # twice on a retry of the whole invocation: a client that misses one reads the job on its next
                    # check (or, missing a delta, sees the gap in ``seq`` and resumes after the last it has).
                    logger.exception("post to connection %s failed", connection_id)
                    outcome.failed += 1
