"""The worker process's settings: every environment variable ``python -m gpu_worker`` reads, read once at start.

The task definition sets them (names in ``async_inference.config``); ``WorkerSettings.load()`` fails at start with an
error naming each variable that is missing or malformed. ``worker_config()`` and ``engine_options()`` turn them into
the arguments of ``Worker`` and ``make_engine``, which read no environment themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from async_inference import config as env
from async_inference import settings
from async_inference.config import ServiceConfig, ServiceSettings
from async_inference.served_models import ServedModels
from gpu_worker.deltas import DEFAULT_INTERVAL_S as DEFAULT_STREAM_INTERVAL_S
from gpu_worker.deployments import DEFAULT_INTERVAL_S as DEFAULT_DEPLOYMENT_CHECK_INTERVAL_S
from gpu_worker.faults import Faults
from gpu_worker.health import HealthSettings
from gpu_worker.lanes import default_reserve
from gpu_worker.model_source import parse_s3_uri
from gpu_worker.task_protection import DEFAULT_RENEW_S, EXPIRES_IN_MINUTES

EngineName = Literal["echo", "simulated", "cpu", "vllm"]  # gpu_worker.engines.ENGINE_NAMES

# Engine -> {settings field: constructor option}: which variables each engine takes (see gpu_worker/engines).
ENGINE_OPTIONS: dict[str, dict[str, str]] = {
    "echo": {"max_num_seqs": "capacity", "echo_delay_s": "delay_s", "echo_max_model_len": "max_model_len"},
    "simulated": {"max_num_seqs": "capacity", "sim_step_s": "step_s", "sim_output_tokens": "output_tokens"},
    "cpu": {"model": "model", "max_num_seqs": "capacity", "max_model_len": "max_model_len"},
    "vllm": {
        "model": "model",
        "max_num_seqs": "max_num_seqs",
        "max_model_len": "max_model_len",
        "gpu_memory_utilization": "gpu_memory_utilization",
        "tensor_parallel_size": "tensor_parallel_size",
        "dtype": "dtype",
        "enforce_eager": "enforce_eager",
        "served_model_name": "served_model_name",
        "tool_call_parser": "tool_call_parser",
    },
}


# Seconds the model's sync and the engine's start may take before the worker gives up and exits (EXIT_START_TIMEOUT).
# Under the health check's 300 s start period + 10 retries x 60 s (cdk/gpu_worker_service.py), after which ECS would
# replace the task as unhealthy anyway: the worker says why first.
ENV_START_TIMEOUT_S = "WORKER_START_TIMEOUT_S"
DEFAULT_START_TIMEOUT_S = 840.0


class WorkerOptions(BaseModel):
    """How the worker's loops run: every option defined once, with its variable, default and bounds. The process reads
    them from its environment (``WorkerSettings``); tests and benchmarks give them by name (``WorkerConfig``)."""

    model_config = SettingsConfigDict(frozen=True, validate_by_name=True, arbitrary_types_allowed=True)

    # A dict: the environment's JSON is decoded by pydantic-settings (WorkerSettings), and WorkerConfig is built from it.
    webhook_queue_urls: dict[str, str] | None = Field(
        None, alias=env.ENV_WEBHOOK_QUEUE_URLS, description='each tenant\'s webhook queue, for "started" events'
    )
    interactive_reserve: int | None = Field(
        None,
        ge=0,
        alias=env.ENV_INTERACTIVE_RESERVE,
        description="engine slots batch lines leave free for interactive jobs (default: 1 per 64 slots, at least 1)",
    )
    events_topic_arn: str | None = Field(
        None, alias=env.ENV_JOB_EVENTS_TOPIC_ARN, description="the job event topic, for job.started and job.progress"
    )
    connections_table_name: str | None = Field(
        None,
        alias=env.ENV_CONNECTIONS_TABLE,
        description="the WebSocket connection table: job.progress is published only for jobs a connection follows",
    )
    progress_interval_s: float = Field(
        settings.PROGRESS_INTERVAL_S,
        ge=0,
        alias=env.ENV_PROGRESS_INTERVAL_S,
        description="seconds between writes of a running job's tokens so far; 0: none",
    )
    stream_table_name: str | None = Field(
        None, alias=env.ENV_STREAM_TABLE, description="the job event log, where streamed jobs' text goes as it decodes"
    )
    stream_interval_s: float = Field(
        DEFAULT_STREAM_INTERVAL_S,
        gt=0,
        alias=env.ENV_STREAM_INTERVAL_S,
        description="seconds between a streamed job's writes to its event log (each only when its text grew)",
    )
    # --- the loops
    heartbeat_interval_s: float = Field(
        settings.HEARTBEAT_INTERVAL_S,
        gt=0,
        alias=env.ENV_HEARTBEAT_INTERVAL_S,
        description="seconds between visibility extensions of held messages",
    )
    visibility_timeout_s: int = Field(
        settings.VISIBILITY_TIMEOUT_S,
        ge=0,
        le=12 * 60 * 60,
        alias=env.ENV_VISIBILITY_TIMEOUT_S,
        description="seconds a received message stays hidden without a heartbeat",
    )
    receive_wait_s: int = Field(
        settings.RECEIVE_WAIT_TIME_S,
        ge=0,
        le=20,
        alias=env.ENV_RECEIVE_WAIT_S,
        description="SQS long-poll seconds, 0 to 20",
    )
    # ECS sends SIGTERM, then SIGKILL after the task's stop timeout (120 s at most on EC2): drain inside it.
    drain_timeout_s: float = Field(
        90.0,
        ge=0,
        alias=env.ENV_DRAIN_TIMEOUT_S,
        description="seconds running jobs may finish after SIGTERM",
    )
    transient_retry_delay_s: int = Field(
        5,
        ge=0,
        alias=env.ENV_TRANSIENT_RETRY_DELAY_S,
        description="seconds before a transient fault's retry, doubled per receive",
    )
    # A job spends part of its life in S3/DynamoDB/SNS calls; if those held engine slots, the engine would idle while
    # they ran. None: max(10, capacity // 2). At a quarter the held budget was always full in `make bench` and the
    # batch ran 85% full; the bench records what this default gives.
    prefetch: int | None = Field(
        None, ge=0, alias=env.ENV_PREFETCH, description="messages held beyond the engine's capacity"
    )
    task_protection_renew_s: float = Field(
        DEFAULT_RENEW_S,
        gt=0,
        lt=EXPIRES_IN_MINUTES * 60,
        alias=env.ENV_TASK_PROTECTION_RENEW_S,
        description=f"seconds between renewals of the {EXPIRES_IN_MINUTES}-minute task protection while busy",
    )
    task_protection: env.TaskProtection = Field(
        env.DEFAULT_TASK_PROTECTION,
        alias=env.ENV_TASK_PROTECTION,
        description="when to hold ECS task protection: long_jobs (jobs that could outlast the drain), busy or off",
    )
    start_timeout_s: float | None = Field(
        DEFAULT_START_TIMEOUT_S,
        gt=0,
        alias=ENV_START_TIMEOUT_S,
        description="seconds the model sync and engine start may take before the worker exits",
    )
    task_protection_tokens_per_s: float = Field(
        env.DEFAULT_TASK_PROTECTION_TOKENS_PER_S,
        gt=0,
        alias=env.ENV_TASK_PROTECTION_TOKENS_PER_S,
        description="decode tokens a second one job is expected to get, for long_jobs",
    )


class WorkerConfig(WorkerOptions):
    """What a ``Worker`` runs with: its options and the resources it reaches. ``WorkerSettings.worker_config()`` builds
    it from the environment; the options are not restated here."""

    service: ServiceConfig
    # The file the container health check reads (gpu_worker.health); None: none is kept (in-process tests, benches).
    health_file: Path | None = None
    # The batch lane (gpu_worker.lanes, docs/design/batches.md): its queue and the control queue that finalize
    # messages go to. None: the worker serves the interactive lane only.
    batch_queue_url: str | None = None
    control_queue_url: str | None = None
    # The model names this worker runs (SERVED_MODELS); a batch line for another is a 404 model_not_found line.
    # None: any name.
    served_models: ServedModels | None = None

    @model_validator(mode="after")
    def _lane_complete(self) -> WorkerConfig:
        if (self.batch_queue_url is None) != (self.control_queue_url is None):
            raise ValueError(
                "batch_queue_url and control_queue_url go together: the batch lane sends each batch's "
                "finalize to the control queue"
            )
        return self

    def held_messages(self, capacity: int) -> int:
        """How many messages a worker holds at most: the engine's capacity plus the prefetch."""
        return capacity + (
            self.prefetch if self.prefetch is not None else max(settings.RECEIVE_BATCH_SIZE, capacity // 2)
        )

    def fair_room(self, capacity: int) -> int:
        """Places a worker keeps in the interactive lane beyond ``held_messages``, for the messages of tenants other
        than one that holds that many already (``gpu_worker.fairness``): half the prefetch, at least one."""
        return max(1, (self.held_messages(capacity) - capacity) // 2)

    def reserve(self, capacity: int) -> int:
        """Engine slots kept free for interactive jobs (``interactive_reserve``, or the default for ``capacity``)."""
        return default_reserve(capacity) if self.interactive_reserve is None else self.interactive_reserve

    def retry_delay_s(self, receive_count: int) -> int:
        """Seconds a message stays hidden after its ``receive_count``-th receive ended in a transient fault."""
        return min(self.transient_retry_delay_s * 2 ** max(0, receive_count - 1), self.visibility_timeout_s)


class WorkerSettings(WorkerOptions, ServiceSettings, HealthSettings):
    """The worker container's environment: the loops' options (``WorkerOptions``), the service's resources
    (``ServiceSettings``), the health file the health check reads too (``HealthSettings``), and the worker's own."""

    engine: EngineName = Field(
        alias=env.ENV_ENGINE,
        description="the inference engine: echo, simulated, cpu or vllm; the task definition sets it",
    )
    queue_url: str = Field(alias=env.ENV_QUEUE_URL, description="the job queue of the worker's model")
    # --- the batch lane (docs/design/batches.md); unset: the worker serves the interactive lane only
    batch_queue_url: str | None = Field(
        None, alias=env.ENV_BATCH_QUEUE_URL, description='the batch-lane queue: batch chunks and "priority: batch" jobs'
    )
    batch_control_queue_url: str | None = Field(
        None, alias=env.ENV_BATCH_CONTROL_QUEUE_URL, description="the batch control queue, for finalize messages"
    )
    batch_table_name: str | None = Field(
        None, alias=env.ENV_BATCH_TABLE, description="the batch table, where chunks are counted"
    )
    ecs_agent_uri: str | None = Field(
        None, alias=env.ENV_ECS_AGENT_URI, description="the ECS agent's endpoint, set by ECS in every task"
    )
    ecs_metadata_uri: str | None = Field(
        None,
        alias="ECS_CONTAINER_METADATA_URI_V4",
        description="the ECS task metadata endpoint, set by ECS in every container: tells a newer deployment apart",
    )
    deployment_check_interval_s: float = Field(
        DEFAULT_DEPLOYMENT_CHECK_INTERVAL_S,
        gt=0,
        alias="DEPLOYMENT_CHECK_INTERVAL_S",
        description="seconds between looks for a newer deployment of the service (DescribeServices)",
    )
    worker_faults: str = Field("", alias=env.ENV_WORKER_FAULTS, description="fault injection, tests only")
    metrics_namespace: str = Field(
        settings.METRICS_NAMESPACE,
        min_length=1,
        alias=env.ENV_METRICS_NAMESPACE,
        description="the CloudWatch namespace of the worker's EMF records",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", alias=env.ENV_LOG_LEVEL)
    # --- the model
    model: str | None = Field(
        None, alias=env.ENV_MODEL, description="the model: a Hugging Face id or directory (vllm: required)"
    )
    model_kind: Literal["chat", "embedding"] = Field(
        "chat", alias="MODEL_KIND", description="chat or embedding: which flavour of ENGINE serves the model"
    )
    model_s3_uri: str | None = Field(
        None, alias=env.ENV_MODEL_S3_URI, description="s3://bucket/prefix/ holding the model files, synced to MODEL_DIR"
    )
    model_dir: Path | None = Field(
        None, alias=env.ENV_MODEL_DIR, description="where the model files from MODEL_S3_URI are kept"
    )
    # --- engine options (None: the engine's default)
    max_num_seqs: int | None = Field(None, ge=1, alias=env.ENV_MAX_NUM_SEQS, description="jobs in the engine at once")
    max_model_len: int | None = Field(None, ge=1, alias=env.ENV_MAX_MODEL_LEN, description="context length in tokens")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, alias=env.ENV_GPU_MEMORY_UTILIZATION, description="fraction of GPU memory vLLM may take"
    )
    tensor_parallel_size: int | None = Field(
        None, ge=1, alias=env.ENV_TENSOR_PARALLEL_SIZE, description="GPUs per engine"
    )
    dtype: str | None = Field(None, alias=env.ENV_DTYPE, description="auto | float16 | bfloat16 | float32")
    enforce_eager: bool | None = Field(None, alias=env.ENV_ENFORCE_EAGER, description="1: no CUDA graphs")
    served_model_name: str | None = Field(
        None, alias=env.ENV_SERVED_MODEL_NAME, description="the name the model answers to"
    )
    tool_call_parser: str | None = Field(
        None, alias=env.ENV_TOOL_CALL_PARSER, description="vLLM's tool-call parser for the model (hermes: Qwen2.5)"
    )
    sim_step_s: float | None = Field(None, gt=0, alias="SIM_STEP_S", description="simulated seconds per step")
    sim_output_tokens: int | None = Field(None, ge=1, alias="SIM_OUTPUT_TOKENS", description="simulated output length")
    echo_delay_s: float | None = Field(None, ge=0, alias="ECHO_DELAY_S", description="echo seconds per request")
    echo_max_model_len: int | None = Field(None, ge=1, alias="ECHO_MAX_MODEL_LEN", description="echo context in words")

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("worker_faults")
    @classmethod
    def _faults_parse(cls, value: str) -> str:
        Faults.parse(value)  # its ValueError names the fault that is wrong
        return value

    @field_validator("model_s3_uri")
    @classmethod
    def _s3_uri_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_s3_uri(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> WorkerSettings:
        batch = {
            env.ENV_BATCH_QUEUE_URL: self.batch_queue_url,
            env.ENV_BATCH_CONTROL_QUEUE_URL: self.batch_control_queue_url,
            env.ENV_BATCH_TABLE: self.batch_table_name,
        }
        if any(batch.values()) and not all(batch.values()):
            missing = ", ".join(name for name, value in batch.items() if not value)
            raise ValueError(f"the batch lane needs {', '.join(batch)} together; {missing} not set")
        if (
            self.interactive_reserve is not None
            and self.max_num_seqs is not None
            and self.interactive_reserve >= self.max_num_seqs
        ):
            raise ValueError(
                f"{env.ENV_INTERACTIVE_RESERVE}={self.interactive_reserve} must be below "
                f"{env.ENV_MAX_NUM_SEQS}={self.max_num_seqs}: batch lines need at least one engine slot"
            )
        if self.model_s3_uri and self.model_dir is None:
            raise ValueError(
                f"{env.ENV_MODEL_S3_URI} is set but {env.ENV_MODEL_DIR} is not: set the directory the "
                "model's files are synced to"
            )
        if self.heartbeat_interval_s >= self.health_max_age_s:
            raise ValueError(
                f"{env.ENV_HEARTBEAT_INTERVAL_S}={self.heartbeat_interval_s:g} must be below "
                f"{env.ENV_HEALTH_MAX_AGE_S}={self.health_max_age_s:g}: each heartbeat keeps the health "
                "file fresh"
            )
        if self.engine == "vllm" and not (self.model or self.model_s3_uri):
            raise ValueError(
                f"{env.ENV_MODEL} is not set: {env.ENV_ENGINE}=vllm needs the model (a Hugging Face id, "
                "a model directory, or MODEL_S3_URI)"
            )
        return self

    def worker_config(self) -> WorkerConfig:
        options = {name: getattr(self, name) for name in WorkerOptions.model_fields}
        # served_models stays unset (any name), as before: the local runtime overrides SERVED_MODELS for functions
        # only, so the task definition's model name would turn every echo-engine batch line into a 404.
        return WorkerConfig(
            service=self.service,
            health_file=self.health_file,
            batch_queue_url=self.batch_queue_url,
            control_queue_url=self.batch_control_queue_url,
            **options,
        )

    def engine_options(self) -> dict[str, Any]:
        """``make_engine``'s options for ``engine``: the variables that engine takes and that are set."""
        options = {
            option: getattr(self, field)
            for field, option in ENGINE_OPTIONS[self.engine].items()
            if getattr(self, field) is not None
        }
        if self.model_s3_uri and "model" in ENGINE_OPTIONS[self.engine]:
            # The engine loads the synced files from disk, and the model keeps answering to its name.
            options["model"] = str(self.model_dir)
            if self.engine == "vllm" and self.model:
                options.setdefault("served_model_name", self.model)
        return options
