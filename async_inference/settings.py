"""Settings that the CDK stack and the runtime code both use, defined once.

The stack imports these to size queues, buckets and limits; the handlers and the worker import them to enforce the same
limits. Change a value here and both sides follow.
"""

from __future__ import annotations

import datetime as dt

# The limits a client must know too (BATCH_ENDPOINT, MAX_FILE_INLINE_BYTES, WS_MAX_JOB_IDS_PER_SUBSCRIBE) are defined in
# the client package, which ships without this module.
from async_inference_client.limits import BATCH_ENDPOINT as BATCH_ENDPOINT
from async_inference_client.limits import MAX_FILE_INLINE_BYTES as MAX_FILE_INLINE_BYTES
from async_inference_client.limits import WS_MAX_JOB_IDS_PER_SUBSCRIBE as WS_MAX_JOB_IDS_PER_SUBSCRIBE

# --- Queue ----------------------------------------------------------------------------------------------------------
# The worker extends the visibility of every message it holds each HEARTBEAT_INTERVAL_S, so the timeout only has to
# outlive a stalled heartbeat, not the longest generation. A crashed worker's jobs come back after this long.
VISIBILITY_TIMEOUT_S = 60
HEARTBEAT_INTERVAL_S = 15
# Receives before SQS moves a message to the DLQ, and the DLQ handler fails the job.
MAX_RECEIVE_COUNT = 5
RECEIVE_WAIT_TIME_S = 20  # SQS long polling maximum
RECEIVE_BATCH_SIZE = 10  # SQS ReceiveMessage maximum
DLQ_RETENTION_DAYS = 14

# --- Payloads and limits --------------------------------------------------------------------------------------------
MAX_INLINE_REQUEST_BYTES = 256 * 1024  # body of POST /v1/jobs
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a presigned upload may announce at most this
MAX_TOKENS_LIMIT = 4096  # max_tokens a job may ask for
DEFAULT_MAX_TOKENS = 256
MAX_MESSAGES = 256
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 8  # n: the most choices one request may ask for (OpenAI takes up to 128; each is a full generation)
MAX_TOOLS = 128  # tools (or legacy functions) one request may declare: OpenAI's limit
MAX_TOP_LOGPROBS = 20  # top_logprobs: OpenAI's limit
MAX_CONTENT_PARTS = 256  # parts of one message's content
MAX_INLINE_RESULT_BYTES = 128 * 1024  # results up to this size travel inside the SNS notification too

# --- The API function ----------------------------------------------------------------------------------------------
API_FUNCTION_TIMEOUT_S = 29  # API Gateway's integration timeout: no request runs longer
# An Idempotency-Key request is "in progress" from when it stores its request body until it creates its job; a
# second request with the same key and a different body in that window gets a 409 to retry. No request lives past
# the function timeout, so a body older than that (plus slack for clock skew and S3's whole-second LastModified) was
# left by a request that ended without creating its job, and binds the key to nothing.
IDEMPOTENCY_IN_PROGRESS_S = API_FUNCTION_TIMEOUT_S + 5

# --- Presigned URLs -------------------------------------------------------------------------------------------------
# A presigned URL stops working when the credentials that signed it expire, whatever its X-Amz-Expires ("Why is my
# presigned URL for an Amazon S3 bucket expiring before the expiration time that I specified?", AWS Knowledge Center:
# "services that assume a role, such as the AWS Lambda execution role, don't necessarily comply with the role's session
# duration settings"). The functions sign with their execution role's session, whose expiry Lambda neither states nor
# exposes (no AWS_CREDENTIAL_EXPIRATION), so no URL they sign is promised longer than this: the 15 minutes the upload
# URLs have always had on the same credentials. A GET of the job signs a fresh one.
SIGNED_URL_MAX_S = 15 * 60
PRESIGNED_UPLOAD_EXPIRY_S = SIGNED_URL_MAX_S  # the API contract promises at most 15 minutes
PRESIGNED_RESULT_EXPIRY_S = SIGNED_URL_MAX_S  # an hour once: past the signing session's end on some reads

# --- Upload deadlines -----------------------------------------------------------------------------------------------
# An upload job's presign window is min(PRESIGNED_UPLOAD_EXPIRY_S, its ttl) from creation; the API sends a message
# delayed to the window's end (SQS delays at most 900 s) and the upload-deadline handler expires the job if it is still
# awaiting its upload UPLOAD_GRACE_S after the window. The grace covers an upload that began just before the window
# closed and its S3 event, late or retried by Lambda (twice, 1 and 2 minutes apart), before the job is expired.
UPLOAD_GRACE_S = 5 * 60
# The upload function's timeout: an acceptance (state write, then the claim check's send) that has not sent its claim
# check this long after the state write never will (its invocation ended), so the event's redelivery sends it.
UPLOAD_INTAKE_TIMEOUT_S = 60
# Receives of a deadline message before it moves to its DLQ: the first receive, at the window's end, is always handed
# back for the grace, so this leaves three for faults.
UPLOAD_DEADLINE_MAX_RECEIVE_COUNT = 5

# --- Deadlines ------------------------------------------------------------------------------------------------------
DEFAULT_TTL_S = 24 * 60 * 60  # a job still queued after this becomes `expired`
MAX_TTL_S = 7 * 24 * 60 * 60
DEFAULT_EXECUTION_TIMEOUT_S = 10 * 60  # a running generation is aborted after this
MAX_EXECUTION_TIMEOUT_S = 60 * 60

# --- Retention ------------------------------------------------------------------------------------------------------
# S3 lifecycle for requests and results: the default of the stack's retention_days, whose deployed value its functions
# and workers read (config.ENV_PAYLOAD_RETENTION_DAYS).
PAYLOAD_RETENTION_DAYS = 7
JOB_RECORD_RETENTION_DAYS = 30  # DynamoDB TTL on finished jobs


def lifecycle_expiry(written_at: dt.datetime, retention_days: int) -> dt.datetime:
    """When an S3 lifecycle expiration of ``retention_days`` may delete an object written at ``written_at``: S3 adds
    the days to the object's creation time and rounds up to the next midnight UTC. The deletion itself is
    asynchronous and may come later; from this moment on the object cannot be relied on."""
    due = (written_at + dt.timedelta(days=retention_days)).astimezone(dt.UTC)
    return dt.datetime.combine(due.date() + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)


# --- Polling --------------------------------------------------------------------------------------------------------
# GET of an unfinished job answers Retry-After: a fifth of the time the job has spent in its state (queued since it was
# queued, running since it started), between 1 s and MAX_POLL_AFTER_S. A poller that follows it sees the job's end at
# most 20% of its age late (and at most MAX_POLL_AFTER_S), and polls a ten-minute job about 45 times: young jobs, which
# often finish soon, are polled each second; old ones, which will not finish in the next second, rarely.
POLL_AFTER_FRACTION = 5
MAX_POLL_AFTER_S = 20

# --- Listing --------------------------------------------------------------------------------------------------------
TENANT_INDEX_NAME = "tenant-created-index"
# Quotas: a tenant's unfinished jobs (awaiting_upload, queued, running) carry ACTIVE_JOBS_ATTRIBUTE (its tenant id),
# removed by the write that makes the job final; the sparse index over it holds exactly the unfinished jobs, which
# the API counts at submit (async_inference.quotas).
ACTIVE_JOBS_INDEX_NAME = "tenant-active-index"
ACTIVE_JOBS_ATTRIBUTE = "active_tenant"
DEFAULT_MAX_ACTIVE_JOBS = 1000  # a tenant's `max_active_jobs` when its plan in the `tenants` context sets none
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100

# --- S3 key layout --------------------------------------------------------------------------------------------------
# Inline bodies (written by the API Lambda) and presigned uploads live under different prefixes, so that the S3 event
# notification that triggers the upload handler fires for uploads only.
REQUEST_PREFIX = "requests/"
UPLOAD_PREFIX = "uploads/"
RESULT_PREFIX = "results/"


def request_key(tenant: str, job_id: str) -> str:
    """Where a job's request body (inline or uploaded) lives."""
    return f"{REQUEST_PREFIX}{tenant}/{job_id}/request.json"


RESPONSES_REQUEST_NAME = "responses.json"  # a background response's POST /v1/responses body, beside its job's request


def responses_request_key(tenant: str, job_id: str) -> str:
    """Where the Responses body of a response's job lives (its job runs the chat request at ``request_key``); its
    presence is what makes the job a response."""
    return f"{REQUEST_PREFIX}{tenant}/{job_id}/{RESPONSES_REQUEST_NAME}"


# The inbox (async_inference.inbox): objects the platform's pipelines write under this prefix, then a rule's
# (the inbox_rules context), become jobs and batches. Its own prefix: neither an upload nor an inline body.
INBOX_PREFIX = "inbox/"


def inbox_marker_key(tenant: str, digest: str) -> str:
    """Where the inbox records that an object (its key and ETag, hashed) was taken in as a batch: written once."""
    return f"{REQUEST_PREFIX}{tenant}/inbox/{digest}.json"


def upload_key(tenant: str, job_id: str) -> str:
    """Where a presigned upload puts a job's request body."""
    return f"{UPLOAD_PREFIX}{tenant}/{job_id}/request.json"


def result_key(tenant: str, job_id: str) -> str:
    """Where a job's chat.completion result lives; one fixed key, so a second write is harmless."""
    return f"{RESULT_PREFIX}{tenant}/{job_id}/result.json"


# --- Batches (docs/design/batches.md) ---------------------------------------------------------------------------------
FILE_PREFIX = "files/"  # Files API objects: batch input files, and the output and error files of batches
BATCH_PREFIX = "batches/"  # per-chunk result parts, until a batch is finalized
BATCH_MAX_LINES = 50_000  # OpenAI's limit per batch input file
BATCH_MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's limit per batch input file
BATCH_CHUNK_LINES = 100  # lines per chunk claim check: one queue message, one ranged read, two part writes
BATCH_COMPLETION_WINDOWS = {"24h": 24 * 60 * 60}  # what OpenAI accepts for completion_window
# The batch table (cdk/batches.py declares it; async_inference/batches/store.py writes it): files and batches, one item
# each, listed per tenant and kind ("<tenant>#file", "<tenant>#batch") newest first through the owner index.
BATCH_TABLE_PARTITION_KEY = "id"
BATCH_OWNER_INDEX_NAME = "owner-created-index"
BATCH_OWNER_ATTRIBUTE = "owner"
BATCH_CREATED_KEY_ATTRIBUTE = "created_key"  # "<created_at, UTC ISO to the microsecond>#<id>"
BATCH_TTL_ATTRIBUTE = "ttl_epoch"
# Quotas: a batch not yet final carries BATCH_ACTIVE_ATTRIBUTE (its tenant), removed by the write that makes it final;
# the sparse index over it (with each batch's line count, `total`) holds exactly the tenant's batches in flight, whose
# lines the API and the controller add up (async_inference.quotas). Stored bytes are the sizes of the tenant's file
# records, read through the owner index: a file's deletion or expiry (TTL) takes its record, and its bytes, with it.
BATCH_ACTIVE_INDEX_NAME = "owner-active-index"
BATCH_ACTIVE_ATTRIBUTE = "active_tenant"
DEFAULT_MAX_BATCH_LINES_IN_FLIGHT = 200_000  # a tenant's `max_batch_lines_in_flight` unless its plan sets one
DEFAULT_MAX_STORED_BYTES = 10 * 1024**3  # a tenant's `max_stored_bytes` (10 GiB: 50 full batch files) unless set
FILE_PURPOSES = ("batch",)  # what POST /v1/files accepts; batch_output files are written by the controller
FILE_RETENTION_DAYS = 30  # files and batches (records and objects) are kept this long after creation
DEFAULT_FILE_PAGE_SIZE = 10_000  # OpenAI's default and maximum for GET /v1/files
DEFAULT_BATCH_PAGE_SIZE = 20  # OpenAI's default for GET /v1/batches
MAX_BATCH_PAGE_SIZE = 100
BATCH_MAX_ERRORS = 100  # structural errors a failed batch lists in errors.data (one per line, the first ones)


def file_key(tenant: str, file_id: str) -> str:
    """Where a file's bytes live (input files uploaded by clients, output and error files of batches)."""
    return f"{FILE_PREFIX}{tenant}/{file_id}/content"


FILE_UPLOAD_NAME = "upload"  # the last part of a presigned file upload's key: its S3 event reaches the upload handler


def file_upload_key(tenant: str, file_id: str) -> str:
    """Where a file's presigned PUT puts its bytes (``POST /v1/files/uploads``): a name of its own, so that the upload
    handler is told of client uploads (a file deleted before its upload arrived) and not of the batches' files."""
    return f"{FILE_PREFIX}{tenant}/{file_id}/{FILE_UPLOAD_NAME}"


def parse_file_upload_key(key: str) -> tuple[str, str] | None:
    """(tenant, file_id) from a file upload key, or None when the key is not one."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] + "/" != FILE_PREFIX or parts[3] != FILE_UPLOAD_NAME:
        return None
    return parts[1], parts[2]


def batch_input_key(tenant: str, batch_id: str) -> str:
    """A batch's own copy of its input file, taken at creation: the presigned URL that uploaded the file (valid 15
    minutes) cannot change what the batch validates and runs. Under FILE_PREFIX: the files' lifecycle and grants."""
    return f"{FILE_PREFIX}{tenant}/{batch_id}/input"


def batch_part_key(tenant: str, batch_id: str, chunk: int, kind: str) -> str:
    """Where one chunk's output or error lines live until the batch is finalized (``kind``: output or error)."""
    if kind not in ("output", "error"):
        raise ValueError(f"part kind {kind!r} is not output or error")
    return f"{BATCH_PREFIX}{tenant}/{batch_id}/parts/{chunk:06d}.{kind}.jsonl"


def batch_results_key(tenant: str, batch_id: str, chunk: int) -> str:
    """Where a worker keeps one chunk's lines, output and error together, written once before either part: both
    parts are cut from it, so a worker killed between the two part writes leaves parts that agree (the worker's)."""
    return f"{BATCH_PREFIX}{tenant}/{batch_id}/results/{chunk:06d}.jsonl"


def parse_upload_key(key: str) -> tuple[str, str] | None:
    """(tenant, job_id) from an upload key, or None when the key is not one of ours."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] + "/" != UPLOAD_PREFIX or parts[3] != "request.json":
        return None
    return parts[1], parts[2]


# --- Added with the CDK app: names the stack and the code must agree on ------------------------------------------------
# Job table key schema (async_inference.aws writes these attributes; the stack declares them).
TABLE_PARTITION_KEY = "job_id"
TENANT_INDEX_PARTITION_KEY = "tenant"
TENANT_INDEX_SORT_KEY = "created_key"  # "<created_at ISO>#<job_id>"
TABLE_TTL_ATTRIBUTE = "ttl_epoch"  # epoch seconds, set when a job becomes final

# CloudWatch metrics, emitted as EMF records on stdout (Lambda and the worker's awslogs driver ship them), and plotted
# by the dashboard. Every name here must be emitted by the process that owns it and shown on the dashboard.
METRICS_NAMESPACE = "AsyncInference"
METRIC_JOBS_SUBMITTED = "JobsSubmitted"  # API: jobs accepted (count)
METRIC_JOBS_SUCCEEDED = "JobsSucceeded"  # worker: jobs that ended succeeded (count)
METRIC_JOBS_FAILED = "JobsFailed"  # worker: jobs that ended failed (count)
METRIC_PROCESSING_TIME = "ProcessingTime"  # worker: seconds from generation start to result stored
METRIC_QUEUE_TIME = "QueueTime"  # worker: seconds from submission to generation start
METRIC_COMPLETION_TOKENS = "CompletionTokens"  # worker: tokens generated (count)
METRIC_WAKE_FAILURES = "WakeFailures"  # API: wake-from-zero calls to ECS that failed (count; async_inference.wake)
# DLQ handler: receives of job-DLQ messages it could not process (not a claim check); each stays in the DLQ for an
# operator and is counted again each time it comes back (after the DLQ's visibility timeout).
METRIC_DEAD_LETTERS_UNPROCESSABLE = "DeadLettersUnprocessable"
WORKER_METRICS = (
    METRIC_JOBS_SUCCEEDED,
    METRIC_JOBS_FAILED,
    METRIC_PROCESSING_TIME,
    METRIC_QUEUE_TIME,
    METRIC_COMPLETION_TOKENS,
)
API_METRICS = (METRIC_JOBS_SUBMITTED, METRIC_WAKE_FAILURES)
DEAD_LETTER_METRICS = (METRIC_DEAD_LETTERS_UNPROCESSABLE,)

# Webhook deliveries: a failed delivery's message is hidden for min(BASE * 2**(n-1), MAX) seconds after its n-th
# receive; after WEBHOOK_MAX_RECEIVE_COUNT receives it moves to the webhook DLQ. 30+60+...+900*5 s > 1 hour of retries.
WEBHOOK_BACKOFF_BASE_S = 30
WEBHOOK_BACKOFF_MAX_S = 15 * 60
WEBHOOK_MAX_RECEIVE_COUNT = 10
# One delivery: a receiver has this long to accept the connection, and to answer (it should queue the work and answer
# 2xx at once).
WEBHOOK_CONNECT_TIMEOUT_S = 3
WEBHOOK_DELIVERY_TIMEOUT_S = 5
# The dispatcher gets batches of WEBHOOK_BATCH_SIZE and delivers them all at once, each with its own timeout, so a
# slow receiver holds back no other delivery and a batch takes about one delivery timeout, whatever its receivers do:
# the URL check's DNS lookup, the POST (at most WEBHOOK_DELIVERY_TIMEOUT_S) and two DynamoDB calls. The function
# timeout leaves that several times over; the queue's visibility timeout outlives it six times (AWS's guidance for SQS
# event sources). A failed delivery is hidden for its backoff by the dispatcher, not by this visibility timeout.
WEBHOOK_BATCH_SIZE = 10
WEBHOOK_DISPATCHER_TIMEOUT_S = 30
WEBHOOK_QUEUE_VISIBILITY_TIMEOUT_S = 6 * WEBHOOK_DISPATCHER_TIMEOUT_S
# Result notifications carry the message attribute webhook="true" when their job has a webhook, and their tenant; each
# tenant's webhook queue subscribes with a filter on both, so jobs without webhooks cost the dispatcher nothing, and a
# tenant's events reach only its own queue (cdk/webhook_dispatch.py).
WEBHOOK_ATTRIBUTE = "webhook"
WEBHOOK_FILTER_POLICY = {WEBHOOK_ATTRIBUTE: ["true"]}
TENANT_ATTRIBUTE = "tenant"


def webhook_filter_policy(tenant: str) -> dict[str, list[str]]:
    """The filter policy of ``tenant``'s webhook queue on the result topic."""
    return {**WEBHOOK_FILTER_POLICY, TENANT_ATTRIBUTE: [tenant]}


def webhook_retry_span_s() -> int:
    """Seconds between a webhook's first delivery attempt and its move to the DLQ (the backoff schedule summed)."""
    return sum(
        min(WEBHOOK_BACKOFF_BASE_S * 2 ** (n - 1), WEBHOOK_BACKOFF_MAX_S) for n in range(1, WEBHOOK_MAX_RECEIVE_COUNT)
    )


# --- Job events and the WebSocket API (docs/notifications.md) ---------------------------------------------------------
# A running job's tokens so far are written to its item, and published as a job.progress event, at most once per this
# many seconds, and only when the count changed since the last time. 0 turns progress off.
PROGRESS_INTERVAL_S = 5.0
# Every message on the job event topic and the result topic carries this attribute (job.started, job.progress,
# job.completed): the push function's subscriptions filter on it, so it sees only the job events it pushes.
EVENT_ATTRIBUTE = "event"
ACTIVITY_EVENTS = ("job.started", "job.progress")
RESULT_EVENT = "job.completed"
# A batch's end on the result topic, named as OpenAI's webhooks name them: pushed to connections that follow the batch.
BATCH_RESULT_EVENTS = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
# The WebSocket API's connection table: one item per open connection with its tenant and its subscriptions, listed per
# tenant through an index; the TTL removes connections whose $disconnect never came.
CONNECTION_TABLE_PARTITION_KEY = "connection_id"
CONNECTION_TENANT_INDEX_NAME = "tenant-connections-index"
CONNECTION_TENANT_KEY = "tenant"
CONNECTION_TTL_ATTRIBUTE = "expires_at"
# API Gateway closes a WebSocket connection after 2 hours (and after 10 idle minutes): a connection item is kept
# that long, then the push function ignores it and DynamoDB's TTL deletes it.
WS_MAX_CONNECTION_S = 2 * 60 * 60
# Open WebSocket connections per tenant: $connect refuses (429) beyond it, so one tenant cannot hold the stage's
# connections (each receives its tenant's events only, so no tenant needs many).
WS_MAX_CONNECTIONS_PER_TENANT = 100
WS_MAX_JOB_IDS_PER_CONNECTION = 1000  # all of a connection's subscribe messages: keeps its item far below 400 KB
WS_ROUTE_SUBSCRIBE = "subscribe"  # the route key, i.e. the "action" of a subscribe message
WS_API_KEY_QUERY_PARAMETER = "api_key"  # browsers cannot set headers on a WebSocket handshake
