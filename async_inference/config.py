"""Runtime configuration: the names of the environment variables, and the settings classes that read them.

The names are constants here because the CDK stack sets them and the code reads them: one definition for both sides.
Each process reads one settings class once, at start (``ServiceSettings.load()`` in the API, upload and DLQ
Lambdas, ``DispatcherSettings.load()`` in the webhook dispatcher, ``gpu_worker.config.WorkerSettings.load()`` in the
worker); a variable that is missing or malformed stops the process there, with an error that names it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self, get_args

from pydantic import Field, Json, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from async_inference import catalog, settings
from async_inference.fleets import FleetRoute
from async_inference.limits import RequestLimits
from async_inference.quotas import TenantQuota

ENV_TABLE = "JOBS_TABLE_NAME"
ENV_BUCKET = "JOBS_BUCKET_NAME"
ENV_QUEUE_URL = "JOBS_QUEUE_URL"
ENV_DLQ_URL = "JOBS_DLQ_URL"
ENV_TOPIC_ARN = "RESULT_TOPIC_ARN"
# Standard Webhooks signing secrets: in AWS a Secrets Manager secret holding {"tenant": "whsec_..."}; locally the
# same JSON inline.
# tenant -> the ARN of its signing secret, as JSON (async_inference.webhooks.secrets).
ENV_WEBHOOK_SECRET_ARNS = "WEBHOOK_SECRET_ARNS"
ENV_WEBHOOK_SECRETS_JSON = "WEBHOOK_SECRETS_JSON"
# tenant -> the URL of its webhook queue, as JSON (cdk/webhook_dispatch.py: a queue per tenant).
ENV_WEBHOOK_QUEUE_URLS = "WEBHOOK_QUEUE_URLS"
# Days the claim-check bucket keeps requests and results (its lifecycle rules): a job records when its result expires.
ENV_PAYLOAD_RETENTION_DAYS = "PAYLOAD_RETENTION_DAYS"
# The upload-deadline queue: the API schedules each upload job's expiry there; its handler expires late uploads.
ENV_UPLOAD_DEADLINES_QUEUE_URL = "UPLOAD_DEADLINES_QUEUE_URL"
# Batches (docs/design/batches.md). The batch-lane queue holds chunk claim checks and jobs submitted with priority
# "batch"; the control queue holds BatchControl messages (plan, finalize); the batch table holds files and batches.
# A worker without the two queue URLs serves the interactive lane only.
ENV_BATCH_QUEUE_URL = "BATCH_QUEUE_URL"
ENV_BATCH_CONTROL_QUEUE_URL = "BATCH_CONTROL_QUEUE_URL"
ENV_BATCH_TABLE = "BATCH_TABLE_NAME"
# The model names the deployed workers serve, as a JSON list (the CDK sets the configured model). A request for any
# other model is a 404 model_not_found. "*" in the list accepts every name (local engines that serve any name only).
ENV_SERVED_MODELS = "SERVED_MODELS"
# Each model's fleet, as a JSON object {"<model>": {"kind", "queue_url", "batch_queue_url", "worker_service"}}
# (async_inference.fleets): what queues a job or a batch's chunks routes them by the request's model, the only way to
# a queue (JOBS_QUEUE_URL and BATCH_QUEUE_URL are a worker's own queues). The functions read it, SERVED_MODELS and
# the tenants' variables below from the deployment's catalog (CATALOG_VARIABLES), not from their environment.
ENV_MODEL_FLEETS = "MODEL_FLEETS"
# The inbox: the rules that turn objects under settings.INBOX_PREFIX into jobs and batches, as a JSON list of
# async_inference.inbox.InboxRule.
ENV_INBOX_RULES = "INBOX_RULES"
# The EventBridge bus the state-events function puts job and batch state changes on (async_inference.state_events).
ENV_EVENT_BUS_NAME = "EVENT_BUS_NAME"
# The worker container's model kind ("chat" or "embedding"): which engine family runs it (gpu_worker's engines).
ENV_MODEL_KIND = "MODEL_KIND"
# The authorizer's tenants: {"<tenant>": ["<API key id>", ...]} (this stack's keys, from its catalog; one id alone
# also reads).
ENV_TENANT_API_KEY_IDS = "TENANT_API_KEY_IDS"
# The API's per-tenant quotas: {"<tenant>": {"max_active_jobs": N}} (from the `tenants` context, through the catalog).
ENV_TENANT_QUOTAS = "TENANT_QUOTAS"
ENV_REQUEST_LIMITS = "REQUEST_LIMITS"  # the deployment's bounds on one request's cost (async_inference.limits)
# "1" only in the local runtime: lets webhooks target http://127.0.0.1 (never set in the stack).
ENV_ALLOW_LOCAL_WEBHOOKS = "ALLOW_LOCAL_WEBHOOKS"
# Overrides of settings.WEBHOOK_BACKOFF_BASE_S / _MAX_S, for the local runtime and tests (never set in the stack).
ENV_BACKOFF_BASE_S = "WEBHOOK_BACKOFF_BASE_S"
ENV_BACKOFF_MAX_S = "WEBHOOK_BACKOFF_MAX_S"
# The worker container (set by the task definition; the worker refuses to start without ENGINE).
ENV_ENGINE = "ENGINE"
ENV_MODEL = "MODEL"
# s3://bucket/prefix/ holding the model's files (config, tokenizer, weights): synced to MODEL_DIR at start, and vLLM
# loads from there. Unset: MODEL is a Hugging Face id (HF_TOKEN, from a secret, for gated models) or a local path.
ENV_MODEL_S3_URI = "MODEL_S3_URI"
ENV_MODEL_DIR = "MODEL_DIR"
# The worker touches this file while its loops run; the container health check (`python3 -m gpu_worker.health`)
# fails when it is older than HEALTH_MAX_AGE_S.
ENV_HEALTH_FILE = "WORKER_HEALTH_FILE"
DEFAULT_HEALTH_FILE = "/tmp/gpu-worker-health"
ENV_HEALTH_MAX_AGE_S = "HEALTH_MAX_AGE_S"
# Four heartbeats (settings.HEARTBEAT_INTERVAL_S): one slow SQS call does not make the task unhealthy, a hung loop
# does within a minute (plus the health check's own interval and retries).
DEFAULT_HEALTH_MAX_AGE_S = 60
# Engine options (gpu_worker/engines/__init__.py documents which engine reads which).
ENV_MAX_NUM_SEQS = "MAX_NUM_SEQS"
ENV_MAX_MODEL_LEN = "MAX_MODEL_LEN"
ENV_GPU_MEMORY_UTILIZATION = "GPU_MEMORY_UTILIZATION"
ENV_TENSOR_PARALLEL_SIZE = "TENSOR_PARALLEL_SIZE"
ENV_DTYPE = "DTYPE"
ENV_ENFORCE_EAGER = "ENFORCE_EAGER"
ENV_SERVED_MODEL_NAME = "SERVED_MODEL_NAME"
ENV_TOOL_CALL_PARSER = "TOOL_CALL_PARSER"  # vLLM's --tool-call-parser for the deployed model (hermes: Qwen2.5)
# The worker's loop timings (defaults in async_inference.settings; the tests shorten them).
ENV_HEARTBEAT_INTERVAL_S = "HEARTBEAT_INTERVAL_S"
ENV_VISIBILITY_TIMEOUT_S = "VISIBILITY_TIMEOUT_S"
ENV_RECEIVE_WAIT_S = "RECEIVE_WAIT_S"
ENV_DRAIN_TIMEOUT_S = "DRAIN_TIMEOUT_S"
ENV_TRANSIENT_RETRY_DELAY_S = "TRANSIENT_RETRY_DELAY_S"
ENV_PREFETCH = "PREFETCH"
# Engine slots a worker keeps for interactive jobs: batch lines fill the engine only beyond them (gpu_worker.lanes).
ENV_INTERACTIVE_RESERVE = "INTERACTIVE_RESERVE"
# Set by the ECS agent in every task: the base URL of its task-protection endpoint.
ENV_ECS_AGENT_URI = "ECS_AGENT_URI"
ENV_TASK_PROTECTION_RENEW_S = "TASK_PROTECTION_RENEW_S"
# When the worker holds ECS task protection (gpu_worker.task_protection): "long_jobs" while it runs a job expected to
# outlast its drain (max_tokens at TASK_PROTECTION_TOKENS_PER_S), so a step-down may stop a task whose jobs finish or
# hand back within the drain; "busy" whenever it holds a job; "off" never. The task definition sets it.
ENV_TASK_PROTECTION = "TASK_PROTECTION"
TaskProtection = Literal["long_jobs", "busy", "off"]
TASK_PROTECTION_MODES: tuple[TaskProtection, ...] = get_args(TaskProtection)
DEFAULT_TASK_PROTECTION: TaskProtection = "long_jobs"
ENV_TASK_PROTECTION_TOKENS_PER_S = "TASK_PROTECTION_TOKENS_PER_S"
# The decode rate one sequence is expected to keep: a full A10G batch of 135 sequences of 4,259 tokens decodes about
# 21 tokens/s each (bench/scaling/engine.py's roofline for Qwen2.5-1.5B). Slower than most batches run, so a job is
# protected rather than not when in doubt.
DEFAULT_TASK_PROTECTION_TOKENS_PER_S = 20.0
ENV_WORKER_FAULTS = "WORKER_FAULTS"
# Wake from zero (async_inference.wake): the functions that queue work set a fleet's ECS service (its route's
# worker_service, in this cluster) to one task when they queue a job and it has none, checking at most once per
# WAKE_CHECK_INTERVAL_S per execution environment.
ENV_WORKER_CLUSTER = "WORKER_CLUSTER_NAME"
ENV_WAKE_CHECK_INTERVAL_S = "WAKE_CHECK_INTERVAL_S"
DEFAULT_WAKE_CHECK_INTERVAL_S = 60
# How long a wake holds the service's scaling minimum at one task (0: no hold): at least the keep-alive plus two
# minutes, and about a warm pool replacement's initialization. See cdk/queue_scaling.py.
ENV_WAKE_HOLD_S = "WAKE_HOLD_S"
DEFAULT_WAKE_HOLD_S = 420
# Each fleet's service, the GPU group a wake also starts an instance in, and the hold's maxima are in its route
# (async_inference.fleets.FleetRoute), not in variables of their own.
# Powertools' own names: the worker's EMF records use them as the Lambdas' do.
ENV_METRICS_NAMESPACE = "POWERTOOLS_METRICS_NAMESPACE"
ENV_LOG_LEVEL = "LOG_LEVEL"


# --- Reading settings -----------------------------------------------------------------------------------------------


class SettingsError(ValueError):
    """Environment variables that are missing or malformed; the message names each one and says what it holds."""


class EnvSettings(BaseSettings):
    """Base of the settings classes: each field is read from the environment variable its alias names.

    Fields may also be given by name (``ServiceSettings(table_name=...)``, for tests); an empty variable counts as
    unset. A field declared with ``repr=False`` holds a secret: an error about it never shows its value.
    """

    model_config = SettingsConfigDict(
        frozen=True, case_sensitive=True, env_ignore_empty=True, validate_by_name=True, extra="ignore"
    )

    @classmethod
    def load(cls, **values: Any) -> Self:
        """The settings from the environment, the deployment's catalog filling the variables it holds that the
        environment does not set (``values`` win); SettingsError naming every bad variable."""
        aliases = {field.alias for field in cls.model_fields.values() if field.alias}
        unset = {name for name in aliases & set(CATALOG_VARIABLES) if not os.environ.get(name)}
        try:
            return cls(**{**catalog_variables(unset), **values})
        except ValidationError as exc:
            raise SettingsError(describe_errors(cls, exc)) from None


# Which part of the catalog (async_inference.catalog) each variable is made from: a JSON object of each entry's value
# under the key, or with no key the JSON list of the entries' names.
CATALOG_VARIABLES: dict[str, tuple[catalog.Part, str | None]] = {
    ENV_TENANT_API_KEY_IDS: (catalog.TENANTS, "api_key_ids"),
    ENV_TENANT_QUOTAS: (catalog.TENANTS, "quota"),
    ENV_WEBHOOK_SECRET_ARNS: (catalog.TENANTS, "webhook_secret_arn"),
    ENV_WEBHOOK_QUEUE_URLS: (catalog.TENANTS, "webhook_queue_url"),
    ENV_MODEL_FLEETS: (catalog.MODELS, "route"),
    ENV_SERVED_MODELS: (catalog.MODELS, None),
}


def catalog_value(entries: Mapping[str, Mapping[str, Any]], key: str | None) -> Any:
    """A catalog variable's value (``CATALOG_VARIABLES``) from its part's entries, before JSON."""
    if key is None:
        return list(entries)
    return {entry: value[key] for entry, value in entries.items() if key in value}


def catalog_variables(names: Collection[str]) -> dict[str, str]:
    """The variables ``names`` made from the deployed catalog (none without ``CATALOG_PATH``): what the stack once set
    in the functions' environments."""
    variables = {}
    for name in names:
        part, key = CATALOG_VARIABLES[name]
        entries = catalog.deployed_part(part)
        if entries is not None:
            variables[name] = json.dumps(catalog_value(entries, key))
    return variables


def describe_errors(cls: type[BaseSettings], exc: ValidationError) -> str:
    """One clause per error: the variable, its value (unless secret), what is wrong and what the variable is for.

    pydantic's own message would print every variable read so far for a missing one, secrets included."""
    fields = {(f.alias or name): f for name, f in cls.model_fields.items()}
    clauses = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(p) for p in error["loc"])
        field = fields.get(name)
        purpose = f" ({field.description})" if field is not None and field.description else ""
        if not name:  # a check across several variables: its message names them
            clauses.append(str(error["msg"]).removeprefix("Value error, "))
        elif error["type"] == "missing":
            clauses.append(f"{name} is not set{purpose}")
        else:
            shown = "" if field is not None and not field.repr else f"={error['input']!r}"
            clauses.append(f"{name}{shown}: {str(error['msg']).removeprefix('Value error, ')}{purpose}")
    return f"{cls.__name__}: " + "; ".join(clauses)


# --- The service's resources ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WakeTarget:
    """The ECS service a job's submitter wakes from zero, and how often one process may check it."""

    cluster: str
    service: str  # the service's ARN (or name)
    check_interval_s: float = DEFAULT_WAKE_CHECK_INTERVAL_S
    hold_s: float = 0.0  # how long a wake holds the scaling minimum at one task
    group: str | None = None  # the GPU Auto Scaling group a wake starts an instance in (None: managed scaling does)
    # The service's scaling maximum, which the end of a hold restores, and the maximum while the hold lasts (None:
    # the hold raises the minimum only).
    max_tasks: int | None = None
    hold_max_tasks: int | None = None


@dataclass(frozen=True)
class WakeSettings:
    """The stack's wake from zero, the same for every fleet: the cluster, how often one process may check a service,
    and how long a wake holds it. Each fleet's service, GPU group and maxima are in its route (``FleetRoute``), and
    its cluster where it has one of its own (``fleet_stacks``)."""

    cluster: str
    check_interval_s: float = DEFAULT_WAKE_CHECK_INTERVAL_S
    hold_s: float = 0.0

    def target(self, route: FleetRoute) -> WakeTarget | None:
        """The wake of the fleet whose route is ``route``; None when the route names no service to wake."""
        if not route.worker_service:
            return None
        return WakeTarget(
            route.worker_cluster or self.cluster,
            route.worker_service,
            self.check_interval_s,
            self.hold_s,
            route.worker_group,
            route.worker_max_tasks,
            route.worker_hold_max_tasks,
        )

    def to_env(self) -> dict[str, str]:
        return {
            ENV_WORKER_CLUSTER: self.cluster,
            ENV_WAKE_CHECK_INTERVAL_S: f"{self.check_interval_s:g}",
            ENV_WAKE_HOLD_S: f"{self.hold_s:g}",
        }


@dataclass(frozen=True)
class ServiceConfig:
    """Where the service's resources are. The CDK stack builds one from its resources' tokens and sets ``to_env()``
    on every function and container; the processes read it back through their settings class."""

    table_name: str
    bucket_name: str
    # A worker's own job queue and its DLQ (None in the functions: they find each model's queues by its route).
    queue_url: str | None
    topic_arn: str
    dlq_url: str | None = None
    # Unset: no upload job gets a scheduled expiry; a GET after its window still expires it.
    upload_deadlines_queue_url: str | None = None
    # Unset: queueing a job wakes nothing; the scaling alarms start a task within minutes.
    wake: WakeSettings | None = None
    payload_retention_days: int = settings.PAYLOAD_RETENTION_DAYS
    # Each model's queues and service (MODEL_FLEETS). The CDK sets it on the functions that queue work, not here.
    fleets: Mapping[str, FleetRoute] | None = None

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_TABLE: self.table_name,
            ENV_BUCKET: self.bucket_name,
            ENV_TOPIC_ARN: self.topic_arn,
            ENV_PAYLOAD_RETENTION_DAYS: str(self.payload_retention_days),
        }
        if self.queue_url:
            env[ENV_QUEUE_URL] = self.queue_url
        if self.dlq_url:
            env[ENV_DLQ_URL] = self.dlq_url
        if self.upload_deadlines_queue_url:
            env[ENV_UPLOAD_DEADLINES_QUEUE_URL] = self.upload_deadlines_queue_url
        if self.wake:
            env.update(self.wake.to_env())
        if self.fleets:
            routes = {name: route.model_dump(exclude_none=True) for name, route in self.fleets.items()}
            env[ENV_MODEL_FLEETS] = json.dumps(routes)
        return env


class ServiceSettings(EnvSettings):
    """The API, upload and dead-letter Lambdas' settings: the ``ServiceConfig`` variables."""

    table_name: str = Field(alias=ENV_TABLE, description="the job table's name")
    bucket_name: str = Field(alias=ENV_BUCKET, description="the claim-check bucket's name")
    queue_url: str | None = Field(None, alias=ENV_QUEUE_URL, description="a worker's job queue's URL")
    topic_arn: str = Field(alias=ENV_TOPIC_ARN, description="the result topic's ARN")
    dlq_url: str | None = Field(None, alias=ENV_DLQ_URL, description="the job queue's dead-letter queue URL")
    upload_deadlines_queue_url: str | None = Field(
        None,
        alias=ENV_UPLOAD_DEADLINES_QUEUE_URL,
        description="the upload-deadline queue's URL (the API schedules there)",
    )
    allow_local_webhooks: bool = Field(
        False, alias=ENV_ALLOW_LOCAL_WEBHOOKS, description="1 lets webhooks target http://127.0.0.1; local runs only"
    )
    # Unset: any model name is accepted (processes built without the stack's configuration, such as unit tests).
    served_models: Json[list[str]] | None = Field(
        None, alias=ENV_SERVED_MODELS, description='the model names the workers serve, as a JSON list: ["name", ...]'
    )
    batch_table_name: str | None = Field(None, alias=ENV_BATCH_TABLE, description="the batch table's name")
    model_fleets: Json[dict[str, FleetRoute]] | None = Field(
        None,
        alias=ENV_MODEL_FLEETS,
        description='each model\'s queues and service, {"model": {"kind", "queue_url", "batch_queue_url", '
        '"worker_service"}}; unset: no model is served',
    )
    tenant_quotas: Json[dict[str, TenantQuota]] | None = Field(
        None, alias=ENV_TENANT_QUOTAS, description='per-tenant quotas, {"tenant": {"max_active_jobs": N}}; unset: none'
    )
    request_limits: Json[RequestLimits] | None = Field(
        None,
        alias=ENV_REQUEST_LIMITS,
        description='bounds on one request\'s cost, {"max_schema_bytes": N, ...} (docs/limits.md); unset: the defaults',
    )
    batch_control_queue_url: str | None = Field(
        None, alias=ENV_BATCH_CONTROL_QUEUE_URL, description="the batch control queue's URL"
    )
    worker_cluster: str | None = Field(
        None, alias=ENV_WORKER_CLUSTER, description="the worker service's ECS cluster (wake from zero)"
    )
    wake_check_interval_s: float = Field(
        DEFAULT_WAKE_CHECK_INTERVAL_S,
        gt=0,
        alias=ENV_WAKE_CHECK_INTERVAL_S,
        description="seconds between two wake checks of one process",
    )
    wake_hold_s: float = Field(
        0.0,
        ge=0,
        alias=ENV_WAKE_HOLD_S,
        description="seconds a wake holds the scaling minimum at one task",
    )

    @property
    def wake(self) -> WakeSettings | None:
        if self.worker_cluster is None:
            return None
        return WakeSettings(self.worker_cluster, self.wake_check_interval_s, self.wake_hold_s)

    payload_retention_days: int = Field(
        settings.PAYLOAD_RETENTION_DAYS,
        ge=1,
        alias=ENV_PAYLOAD_RETENTION_DAYS,
        description="days the bucket keeps requests and results",
    )

    @property
    def service(self) -> ServiceConfig:
        return ServiceConfig(
            table_name=self.table_name,
            bucket_name=self.bucket_name,
            queue_url=self.queue_url,
            topic_arn=self.topic_arn,
            dlq_url=self.dlq_url,
            upload_deadlines_queue_url=self.upload_deadlines_queue_url,
            wake=self.wake,
            payload_retention_days=self.payload_retention_days,
            fleets=self.model_fleets,
        )


class DispatcherSettings(EnvSettings):
    """The webhook dispatcher Lambda's settings."""

    table_name: str = Field(alias=ENV_TABLE, description="the job table's name")
    webhook_queue_urls: Json[dict[str, str]] = Field(
        alias=ENV_WEBHOOK_QUEUE_URLS, description='{"tenant": "<URL of its webhook queue>"}'
    )
    # Unset: batch events are dropped (a stack without batches).
    batch_table_name: str | None = Field(
        None, alias=ENV_BATCH_TABLE, description="the batch table's name (batch webhooks)"
    )
    webhook_secret_arns: Json[dict[str, str]] | None = Field(
        None, alias=ENV_WEBHOOK_SECRET_ARNS, description='{"tenant": "<ARN of its Secrets Manager signing secret>"}'
    )
    webhook_secrets_json: Json[dict[str, str | list[str]]] | None = Field(
        None, alias=ENV_WEBHOOK_SECRETS_JSON, repr=False, description='{"tenant": "whsec_..."} inline, unit tests only'
    )
    allow_local_webhooks: bool = Field(
        False, alias=ENV_ALLOW_LOCAL_WEBHOOKS, description="1 lets webhooks target http://127.0.0.1; local runs only"
    )
    webhook_backoff_base_s: int = Field(
        settings.WEBHOOK_BACKOFF_BASE_S, ge=0, alias=ENV_BACKOFF_BASE_S, description="first retry delay in seconds"
    )
    webhook_backoff_max_s: int = Field(
        settings.WEBHOOK_BACKOFF_MAX_S, ge=0, alias=ENV_BACKOFF_MAX_S, description="longest retry delay in seconds"
    )

    @model_validator(mode="after")
    def _has_secrets(self) -> DispatcherSettings:
        if self.webhook_secrets_json is None and self.webhook_secret_arns is None:
            raise ValueError(
                f"set {ENV_WEBHOOK_SECRET_ARNS} (or {ENV_WEBHOOK_SECRETS_JSON} in tests): the tenants' "
                "webhook signing secrets"
            )
        return self


# --- Job events and the WebSocket API -------------------------------------------------------------------------------

# The job event topic (job.started, job.progress); unset: the worker publishes none (no WebSocket API is deployed).
ENV_JOB_EVENTS_TOPIC_ARN = "JOB_EVENTS_TOPIC_ARN"
ENV_PROGRESS_INTERVAL_S = "PROGRESS_INTERVAL_S"
ENV_CONNECTIONS_TABLE = "CONNECTIONS_TABLE_NAME"
# The job event log of streamed jobs (async_inference.streaming.log); unset: nothing streams.
ENV_STREAM_TABLE = "JOB_STREAM_TABLE_NAME"
ENV_STREAM_INTERVAL_S = "STREAM_INTERVAL_S"
# Where the push function posts to connections: the stage's management API (https://{api}.execute-api.../{stage}).
ENV_WEBSOCKET_CALLBACK_URL = "WEBSOCKET_CALLBACK_URL"


class WebSocketSettings(EnvSettings):
    """The WebSocket routes' function ($connect, $disconnect, subscribe, $default)."""

    connections_table_name: str = Field(alias=ENV_CONNECTIONS_TABLE, description="the connection table's name")
    tenant_api_key_ids: Json[dict[str, str | list[str]]] = Field(
        alias=ENV_TENANT_API_KEY_IDS,
        description='the tenants\' API key ids, {"tenant": ["key id", ...]} (as the authorizer\'s)',
    )
    stream_table_name: str | None = Field(
        None,
        alias=ENV_STREAM_TABLE,
        description="the job event log's table: a subscription with starting_after is answered with the deltas since; "
        "unset: with none",
    )


class AuthorizerSettings(EnvSettings):
    """The REST API's authorizer."""

    tenant_api_key_ids: Json[dict[str, str | list[str]]] = Field(
        alias=ENV_TENANT_API_KEY_IDS, description='the tenants\' API key ids, {"tenant": ["key id", ...]}'
    )


class PushSettings(EnvSettings):
    """The push function's settings."""

    connections_table_name: str = Field(alias=ENV_CONNECTIONS_TABLE, description="the connection table's name")
    websocket_callback_url: str = Field(
        alias=ENV_WEBSOCKET_CALLBACK_URL, min_length=1, description="the WebSocket stage's management API URL"
    )
    tenant_api_key_ids: Json[dict[str, str | list[str]]] | None = Field(
        None,
        alias=ENV_TENANT_API_KEY_IDS,
        description='the tenants\' API key ids, {"tenant": ["key id", ...]}: a connection whose key is no longer among '
        "them is closed; unset: not checked",
    )
