"""The inbox: an object written under a rule's prefix of the claim-check bucket becomes a job or a batch.

The platform's own pipelines drop documents or JSONL files under ``settings.INBOX_PREFIX`` + a rule's ``prefix``; an
S3 ObjectCreated notification with that prefix filter invokes the inbox function (cdk/inbox.py), which hands
each object to ``InboxIntake.accept``:

* a key ending in ``.jsonl`` becomes a batch: the object is copied into a file of the rule's tenant (purpose
  ``batch``) and a batch is created on it for the rule's endpoint, exactly as ``POST /v1/files`` then ``POST
  /v1/batches`` would (the batch lines name their model, as every batch line does);
* anything else becomes a job: a JSON object with ``messages`` is the chat.completions body itself (its ``model``
  defaulting to the rule's); any other content is read as UTF-8 text and becomes the one user message of a chat
  request for the rule's model.

Either way the result and the notifications are a job's or a batch's: the result topic, the rule's ``webhook_url``
(signed with the tenant's secret, ``completed`` events), the WebSocket API, ``GET /v1/jobs/{id}`` or ``/v1/batches``.
The job's (and the batch's) metadata names the object (``source_key``) and the rule (``rule``), so a subscriber can
tell what it answers. S3 may deliver an event twice: a job's id derives from the object's key and ETag (an
Idempotency-Key), and a batch is created once per key and ETag (a marker object written with a conditional PUT
claims the object, and names the batch once it exists), so a redelivered event creates nothing new; a claim left by
an invocation that ended before its batch existed is taken over once it is older than the function's timeout, so the
object is never left untaken. A new version of the object (another ETag) is a new job or batch.

An object that cannot become one (no rule, over the size limit, a body the request schema refuses, a model not
served) is refused with the reason logged, naming the object; there is no client to answer, and no job was accepted.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from async_inference import safe_json, settings
from async_inference.batches.models import BatchCreate, BatchWebhookSpec
from async_inference.jobs_service import ErrorKind, ServiceError
from async_inference.schemas import ChatCompletionRequest, JobSubmission, utcnow

logger = logging.getLogger("async_inference.inbox")
JSONL_SUFFIX = ".jsonl"
IDEMPOTENCY_NAMESPACE = "s3-event:"  # a job's Idempotency-Key: this, the key and the ETag
# The inbox function's timeout (cdk/inbox.py): a batch's input file is copied (up to
# settings.BATCH_MAX_FILE_BYTES) before the batch is created. A batch's claim (its marker without a batch id) older
# than it (plus slack for S3's whole-second LastModified) was left by an invocation that ended before its batch.
FUNCTION_TIMEOUT_S = 120
CLAIM_TIMEOUT_S = FUNCTION_TIMEOUT_S + 5


class ClaimInProgress(RuntimeError):
    """Another invocation is taking the same object in: the event is retried later (Lambda's asynchronous retry)."""


class InboxRule(BaseModel):
    """One rule of the ``inbox_rules`` context: which objects, for which tenant, run how, told to whom."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefix: str = Field(min_length=1, description="under settings.INBOX_PREFIX: objects whose key starts with it")
    tenant: str = Field(min_length=1, description="who owns the jobs and batches (a tenant of the stack)")
    model: str = Field(min_length=1, description="the model a job runs when its object does not name one")
    endpoint: Literal["/v1/chat/completions"] = "/v1/chat/completions"
    webhook_url: str | None = Field(None, description="told when each job or batch ends (the tenant's signed webhook)")

    @property
    def key_prefix(self) -> str:
        return settings.INBOX_PREFIX + self.prefix


@dataclass(frozen=True)
class Accepted:
    """What an object became: a job (``job_id``) or a batch (``batch_id``), or refused with ``reason``."""

    key: str
    job_id: str | None = None
    batch_id: str | None = None
    reason: str | None = None


def rule_for(rules: list[InboxRule], key: str) -> InboxRule | None:
    """The rule whose prefix the key starts with (the longest, when prefixes nest)."""
    matching = [rule for rule in rules if key.startswith(rule.key_prefix)]
    return max(matching, key=lambda rule: len(rule.key_prefix), default=None)


def chat_request(body: bytes, rule: InboxRule) -> ChatCompletionRequest:
    """The chat request an object's bytes stand for (module docstring); ValueError with the reason otherwise."""
    try:
        parsed = safe_json.loads(body)
    except (safe_json.UnsafeJson, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict) and "messages" in parsed:
        try:
            return ChatCompletionRequest.model_validate({"model": rule.model, **parsed})
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in error["loc"]) or "(body)"
            message = f"the object is a chat.completions body the schema refuses: {where}: {error['msg']}"
            raise ValueError(message) from None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the object is neither a chat.completions JSON body nor UTF-8 text") from None
    if not text.strip():
        raise ValueError("the object is empty")
    return ChatCompletionRequest.model_validate({"model": rule.model, "messages": [{"role": "user", "content": text}]})


class InboxIntake:
    """Turns objects under the rules' prefixes into jobs and batches through the same services the API uses."""

    def __init__(  # noqa: ANN001
        self, *, rules: list[InboxRule], jobs, batches=None, claim_timeout_s: float = CLAIM_TIMEOUT_S
    ) -> None:
        self.rules = rules
        self.claim_timeout_s = claim_timeout_s
        self.jobs = jobs  # jobs_service.JobApi
        self.batches = batches  # batches.service.BatchService; None: a .jsonl object is refused
        self.blobs = jobs.blobs

    def accept(self, key: str, size: int, etag: str) -> Accepted:
        rule = rule_for(self.rules, key)
        if rule is None:
            return self._refused(key, "no inbox rule's prefix matches it")
        if key.endswith(JSONL_SUFFIX):
            return self._batch(key, size, etag, rule)
        return self._job(key, size, etag, rule)

    def _metadata(self, key: str, rule: InboxRule) -> dict[str, str]:
        # Metadata values hold at most MAX_METADATA_VALUE_CHARS: a longer key keeps its end, where its name is.
        limit = settings.MAX_METADATA_VALUE_CHARS
        return {"source_key": key[-limit:], "rule": rule.prefix[:limit]}

    def _job(self, key: str, size: int, etag: str, rule: InboxRule) -> Accepted:
        if size > settings.MAX_UPLOAD_BYTES:
            return self._refused(key, f"{size} bytes is over the {settings.MAX_UPLOAD_BYTES} bytes a job's body may be")
        try:
            request = chat_request(self.blobs.get(key, max_bytes=settings.MAX_UPLOAD_BYTES), rule)
        except KeyError:
            return self._refused(key, "the object is gone")
        except ValueError as exc:
            return self._refused(key, str(exc))
        submission = JobSubmission.model_validate(
            {
                "request": request,
                "metadata": self._metadata(key, rule),
                **({"webhook": {"url": rule.webhook_url}} if rule.webhook_url else {}),
            }
        )
        try:
            submitted = self.jobs.submit(rule.tenant, submission, f"{IDEMPOTENCY_NAMESPACE}{key}:{etag}")
        except Exception as exc:  # ServiceError: a model not served, an unsafe webhook, a quota; or AWS
            message = getattr(exc, "message", None) or str(exc)
            if not isinstance(exc, ServiceError) or exc.kind is ErrorKind.UNAVAILABLE:
                raise  # retried by Lambda's asynchronous invocation, then kept in the failure queue
            return self._refused(key, message)
        logger.info("object became a job", extra={"key": key, "job_id": submitted.job.job_id})
        return Accepted(key, job_id=submitted.job.job_id)

    def _batch(self, key: str, size: int, etag: str, rule: InboxRule) -> Accepted:
        if self.batches is None:
            return self._refused(key, "this deployment has no batches")
        if size > settings.BATCH_MAX_FILE_BYTES:
            return self._refused(key, f"{size} bytes is over a batch input file's {settings.BATCH_MAX_FILE_BYTES}")
        marker = settings.inbox_marker_key(rule.tenant, hashlib.sha256(f"{key}\n{etag}".encode()).hexdigest())
        record = self.batches._new_file(rule.tenant, filename=key.rsplit("/", 1)[-1], purpose="batch", size=size)
        claimed = self.blobs.put_json_once(marker, json.dumps({"file_id": record.id}).encode())
        if claimed is not None:  # a redelivered event, or a second copy of one running now
            taken = json.loads(claimed)
            if taken.get("batch_id"):
                return self._refused(key, f"already taken in as batch {taken['batch_id']}")
            written = self.blobs.written_at(marker)
            if written is not None and (utcnow() - written).total_seconds() < self.claim_timeout_s:
                # Another invocation holds the claim and may still create the batch: Lambda retries this event later.
                raise ClaimInProgress(f"{key}: another invocation is taking it in; retried later")
            # The claim outlived any invocation that made it (the function's timeout): that one ended without its
            # batch, so this one takes the object in, rather than leave it never taken in.
            self.blobs.put_json(marker, json.dumps({"file_id": record.id}).encode())
        try:
            self.batches.files.copy(key, record.key)
        except KeyError:
            return self._refused(key, "the object is gone")
        self.batches.store.create(record)
        create = BatchCreate(
            input_file_id=record.id,
            endpoint=rule.endpoint,
            completion_window="24h",
            metadata=self._metadata(key, rule),
            webhook=BatchWebhookSpec(url=rule.webhook_url) if rule.webhook_url else None,
        )
        batch = self.batches.create_batch(rule.tenant, create)
        self.blobs.put_json(marker, json.dumps({"file_id": record.id, "batch_id": batch.id}).encode())
        logger.info("object became a batch", extra={"key": key, "batch_id": batch.id, "file_id": record.id})
        return Accepted(key, batch_id=batch.id)

    @staticmethod
    def _refused(key: str, reason: str) -> Accepted:
        logger.error("object under the event prefix not taken in: %s", reason, extra={"key": key, "reason": reason})
        return Accepted(key, reason=reason)
