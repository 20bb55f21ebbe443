"""AsyncInferenceService: the whole service as one construct, with every option documented and defaulted here."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from async_inference import settings
from async_inference.config import (
    DEFAULT_TASK_PROTECTION,
    DEFAULT_TASK_PROTECTION_TOKENS_PER_S,
    DEFAULT_WAKE_CHECK_INTERVAL_S,
    DEFAULT_WAKE_HOLD_S,
    ENV_BATCH_QUEUE_URL,
    ENV_BATCH_TABLE,
    ENV_DLQ_URL,
    ENV_MODEL_FLEETS,
    ENV_MODEL_KIND,
    ENV_PROGRESS_INTERVAL_S,
    ENV_QUEUE_URL,
    ENV_REQUEST_LIMITS,
    ENV_SERVED_MODELS,
    ENV_TENANT_QUOTAS,
    ENV_TOOL_CALL_PARSER,
    ENV_WEBHOOK_QUEUE_URL,
    TASK_PROTECTION_MODES,
    ServiceConfig,
)
from async_inference.events_in import EventRule
from async_inference.limits import RequestLimits
from cdk import capacity
from cdk.batches import Batches
from cdk.claim_check_bucket import ClaimCheckBucket
from cdk.dead_letter_handler import DeadLetterHandler
from cdk.events_in import EventsIn, validate_rules
from cdk.gpu_capacity import GpuCapacity
from cdk.gpu_worker_service import INSTANCE_WARMUP, MODELS_CONTAINER_PATH, GpuWorkerService, is_arm64
from cdk.ingestion_api import IngestionApi, TenantPlan
from cdk.job_queue import JobQueue
from cdk.job_table import JobTable
from cdk.lambda_code import LambdaCode
from cdk.model_fleet import MAX_MODELS, ModelFleet, ModelSpec
from cdk.model_store import ModelStore, parse_s3_uri
from cdk.monitoring import MonitoredFleet, Monitoring
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix
from cdk.queue_scaling import JOBS_PER_TASK_IN_BATCHES, CountedQueue, QueueScaling
from cdk.result_topics import ResultTopics, TopicSubscription
from cdk.state_events import StateEvents
from cdk.upload_deadlines import UploadDeadlines
from cdk.upload_intake import UploadIntake
from cdk.webhook_dispatch import WebhookDispatch
from cdk.websocket_push import WebSocketPush

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
MODEL_SOURCES = ("huggingface", "s3")
# vLLM's tool-call parser for a model family (name prefix -> parser), from vLLM's tool calling docs: Qwen2.5 writes
# Hermes-style <tool_call> blocks. A model not listed serves tool_choice auto only with tool_call_parser set.
TOOL_CALL_PARSERS = {"Qwen/Qwen2.5-": "hermes", "Qwen/Qwen3-": "hermes", "NousResearch/Hermes-": "hermes"}
WORKER_SUBNETS = ("private", "public")
# Stopped instances in the GPU warm pool by default: one, for the wake (docs/scaling.md, decided by the simulator).
DEFAULT_WARM_POOL_INSTANCES = 1
# A complete secret ARN ends with the 6 characters Secrets Manager appends: IAM grants on a partial ARN would not match.
SECRET_ARN_PATTERN = r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+-[A-Za-z0-9]{6}$"

# The Responses bodies of background responses (settings.responses_request_key), one per response, under any tenant.
RESPONSES_BODIES = f"{settings.REQUEST_PREFIX}*/{settings.RESPONSES_REQUEST_NAME}"
# The Files API's presigned uploads (settings.file_upload_key), under any tenant and file.
FILE_UPLOADS = f"{settings.FILE_PREFIX}*/{settings.FILE_UPLOAD_NAME}"


@dataclass(frozen=True, kw_only=True)
class AsyncInferenceServiceProps:
    """Options of :class:`AsyncInferenceService`. Every option has a default; :meth:`validate` rejects conflicts.

    Tenants and API
      tenants: tenant id -> usage plan (throttling, daily quota); one API key named by the tenant id each.
        Default: ``{"demo": TenantPlan()}``.
      api_stage_name: Default: ``"prod"``.
      create_api_gateway_cloudwatch_role: create the account-wide role API Gateway logs with. Default: True.
      request_limits: the bounds on one request's cost (json_schema size, depth and alternatives; the context
        length a prompt is checked against; n x max_tokens), ``async_inference.limits.RequestLimits``; a tenant's plan
        may change them (``TenantPlan.request_limits``). docs/limits.md has the table. Default: ``RequestLimits()``.
      waf_requests_per_5_min_per_ip: a WAF web ACL on the REST stage that blocks an IP address over this many
        requests in 5 minutes (authenticated or not) and requests from AWS's IP reputation list and with known bad
        inputs; unauthenticated floods then stop before the authorizer runs. None: no web ACL. Default: None.
    Payloads
      retention_days: days before requests, uploads and results expire. Default: ``settings.PAYLOAD_RETENTION_DAYS``.
      cors_allowed_origins: browser origins allowed to PUT presigned uploads. Default: ``("*",)``.
    Events in
      event_rules: objects written under ``inbox/<prefix>`` of the claim-check bucket become jobs (any object) or
        batches (``.jsonl``) of a tenant by rule (``async_inference.events_in.EventRule``: prefix, tenant, model,
        endpoint, webhook_url), through an S3 notification per rule and the events-in function
        (``cdk.events_in.EventsIn``). Default: none (no function, no notification).
    Notifications
      eventbridge_events: put each job and batch state change (started, the final states, a batch's end) on the
        account's default EventBridge bus (``cdk.state_events.StateEvents``), source ``async-inference``. Default:
        False (one more invocation and PutEvents per job).
      subscriptions: subscribers of the result topic (email, https, sqs; optional status and tenant filters, and
        tenant_scoped for a subscription given to a tenant). Default: none.
      websocket_push: a WebSocket API that pushes job events (started, progress, final state) to subscribed clients,
        with the job event topic the workers publish started and progress events to. False: neither exists, and the
        workers publish no such events (progress is still recorded on the job). Default: True.
      progress_interval_s: seconds between a running job's progress writes (its tokens so far, on the job and as a
        job.progress event), each only when the count changed; 0: no progress. Default:
        ``settings.PROGRESS_INTERVAL_S`` (5).
    Workers
      model: the model vLLM serves: its Hugging Face id, and its name when the weights come from S3. Default:
        ``"Qwen/Qwen2.5-1.5B-Instruct"``. With ``models``, the first model's name (its fleet keeps the resources a
        one-model stack has, and the stack outputs name them).
      models: the models the stack serves, each with its own fleet (``cdk.model_fleet.ModelSpec``: name, kind
        ``chat`` or ``embedding``, source, instance type, task limits, the options below for that model). The API
        routes each request by its ``model`` (``async_inference.fleets``); ``GET /v1/models`` lists them all. The
        first model is ``model`` and takes the options below where its entry leaves them unset; each further model
        gets a fleet of its own (``cdk.model_fleet.ModelFleet``) in the first one's VPC and cluster. At most
        ``cdk.model_fleet.MAX_MODELS``. Default: none, one model: ``model`` with the options below.
      tool_call_parser: vLLM's parser that reads tool calls out of the model's text (tool_choice ``auto``). Default:
        the one ``TOOL_CALL_PARSERS`` names for the model's family (``hermes`` for Qwen2.5), else none (tool_choice
        ``auto`` is then refused by the workers; forced tool choices work without a parser).
      model_source: where the workers get the weights at task start. ``"huggingface"``: downloaded from the Hub over
        the NAT gateway (public models, or gated ones with ``hf_token_secret_arn``). ``"s3"``: synced from an S3 prefix
        through the VPC's S3 endpoint into ``MODEL_DIR`` on the instance's model volume, so a task restarted on the
        same instance copies only what changed; the prefix is ``model_s3_uri``, or, without it, ``<model>/`` in a
        private, encrypted, TLS-only bucket the stack creates (stack output ``ModelBucketName``). The task role may
        read that prefix only. Default: ``"huggingface"``.
      model_s3_uri: ``s3://bucket/prefix/`` of weights uploaded already (same region; SSE-S3 or ``aws/s3``
        encryption); only with ``model_source="s3"``. Default: none (the stack creates the bucket).
      hf_token_secret_arn: complete ARN of a Secrets Manager secret whose value is a Hugging Face token, given to
        the worker as the container secret HF_TOKEN (gated models); only with ``model_source="huggingface"``.
        Default: none.
      max_num_seqs: sequences vLLM batches at once (and the worker's concurrency). Default: sized by
        ``cdk.capacity.max_num_seqs`` from the model's shape and the GPU's memory: the KV cache that GPU memory x 0.9
        leaves after the weights and 2 GiB of engine memory, divided by the KV bytes of ``planned_sequence_tokens``,
        capped at vLLM's 256. 135 for Qwen2.5-1.5B on a g5.xlarge (A10G). A model or instance type without an entry
        in ``cdk.capacity.MODELS`` / ``INSTANCE_GPUS`` must set it.
      planned_sequence_tokens: the context (prompt plus output) a sequence is planned to reach, for the sizing rule;
        only without ``max_num_seqs``. Default: 4,259 (``cdk.capacity.DEFAULT_SEQUENCE_TOKENS``, the p99 of the Azure
        LLM inference conversation trace); vLLM preempts the rare longer one rather than failing it.
      gpu_instance_type: Default: ``"g5.xlarge"``. Its architecture sets the worker image's platform (arm64 for
        Graviton GPU types such as g5g, amd64 otherwise).
      gpu_ami_parameter_name: SSM parameter holding the AMI of the GPU instances. Default: none, ECS's GPU-optimized
        Amazon Linux 2023 AMI, which is x86_64 only; required with an arm64 ``gpu_instance_type``.
      gpus_per_instance: GPUs of ``gpu_instance_type``. Default: 1.
      max_gpu_instances: Default: 2.
      max_worker_tasks: one task per GPU. Default: 2.
      deployment_spare_instances: GPU instances, beyond those ``max_worker_tasks`` fill, that a deployment may start
        new tasks on before it stops old ones (start-before-stop, no capacity dip, the spare instance paid while a
        deployment runs); ``max_gpu_instances`` must include them. 0: stop-before-start (an old task stops, once idle
        or unprotected, before its replacement starts in its GPU). Either way a deployment at full load can place its
        tasks; ``cdk.gpu_worker_service.GpuWorkerService`` explains both. Default: 0.
      worker_memory_reservation_mib: Default: 12288.
      gpu_instance_warmup_seconds: after launching a GPU instance, how long ECS managed scaling waits before it
        launches another (the capacity provider's instance warm-up). Default: 120 (a GPU instance's boot; ECS's own
        default, 300, holds a second instance back 5 minutes).
      gpu_warm_pool_instances: stopped GPU instances kept in an EC2 Auto Scaling warm pool, their volume holding the
        image and the weights, fetched before they stop (``cdk.gpu_capacity.GpuCapacity``); each costs
        its EBS volume (100 GiB gp3, about $8 a month). 0: no pool. Default: 1 (the wake's instance; each start
        from the pool launches a replacement that runs, billed, through its initialization, so a second pooled
        instance costs more GPU hours than it saves: docs/scaling.md).
      release_empty_gpu_instances: release a GPU instance that runs no task within a minute (drained and checked
        first, never one with a task) instead of ECS managed scaling's 15 minutes. Default: True.
      worker_task_protection: when a worker holds ECS task scale-in protection. ``"long_jobs"``: while it runs a
        job whose max_tokens at ``worker_task_protection_tokens_per_s`` would outlast its 90 s SIGTERM drain, so
        a step-down may stop a busy task whose jobs finish or hand back within the drain; ``"busy"``: whenever it
        holds a job (a busy task is never stopped, and a step-down waits for an idle one); ``"off"``: never.
        Default: ``"long_jobs"``.
      worker_task_protection_tokens_per_s: decode tokens a second one sequence is expected to keep, for
        ``"long_jobs"``. Default: 20 (a full A10G batch of 135 sequences of 4,259 tokens, in the roofline of
        bench/scaling/engine.py): jobs with max_tokens above 1,800 are protected.
      worker_image_context: Docker build context of the worker. Default: the repository root.
      worker_dockerfile: relative to the context. Default: ``"gpu_worker/Dockerfile"``.
      nat_gateways: NAT gateways of the VPC, with ``worker_subnets="private"``. Default: 1 (one zone's: a failure of
        that zone cuts every worker's route to SQS, SNS and the Hub; 2 removes it, for another ~$33 a month).
      worker_subnets: where the GPU instances live. ``"private"``: private subnets; SQS, SNS and the Hugging Face Hub
        over the NAT gateway(s), ECR and CloudWatch Logs through interface endpoints (one per zone each), S3 and
        DynamoDB through gateway endpoints. ``"public"``: public subnets, each instance with a public IPv4 address
        (paid only while it runs) and a security group without any inbound rule; no NAT gateway and no interface
        endpoints, so nothing of the network is paid while scaled to zero (docs/deploying.md, "What zero costs").
        Default: ``"private"``.
      availability_zones: the zones of the VPC (and so of the GPU instances): ones where ``gpu_instance_type`` is
        offered (``async-inference preflight`` lists them). Default: none, the region's first two, whatever they offer.
    Scaling (``cdk.queue_scaling.QueueScaling`` explains each alarm; docs/scaling.md the simulation behind the defaults)
      jobs_per_task: jobs (visible or in flight) one task is sized for; the scale-out keeps CEIL(backlog / this)
        tasks wanted, counting tasks still starting. Default: ``max_num_seqs`` (one task's batch; docs/scaling.md has
        the simulation behind it).
      scale_out_cooldown_seconds: pause after a scale-out before the next adds more. Default: 60.
      scale_in_fill: a task is removed once the backlog fits one task fewer at this fraction of ``jobs_per_task``,
        in (0, 1]. Default: 0.5.
      scale_in_minutes: consecutive minutes of spare capacity before a task is removed (one at a time, never the
        last). Default: 3.
      scale_in_cooldown_seconds: pause after removing a task before removing another. Default: 120.
      idle_minutes_before_scale_in: the keep-alive: minutes with nothing visible, in flight or sent before scaling to
        zero (any message sent restarts it). Default: 3.
      wake_from_zero: the API and upload functions set the worker service's desired count to 1 when they queue a job
        and it is 0, without waiting for CloudWatch (``async_inference.wake``; ecs:DescribeServices and
        ecs:UpdateService on that one service), and raise the GPU Auto Scaling group from 0 to 1 instance so the
        instance starts at once (autoscaling:SetDesiredCapacity on that one group; ``cdk.gpu_capacity``).
        Default: True.
      wake_check_interval_seconds: how often one function execution environment may check. Default: 60.
      wake_hold_seconds: how long a wake holds the service's scaling bounds: its minimum at 1, so that the keep-alive
        alarm, still in ALARM from the idle minutes before, cannot set the count back to 0; and, with a warm pool of
        fewer instances than ``max_worker_tasks``, its maximum at the pool's size, so that a further task waits for the
        pool's replacement instead of a fresh instance (``cdk.queue_scaling``). 0: no hold. Default: 420 (the pool's
        replacement initializes in about 7 minutes: boot, image pull, weights; docs/scaling.md).
    Monitoring
      oldest_message_alarm_seconds: alarm threshold on the age of the oldest queued job. Default: 900.
      alarm_topic_arn: an existing SNS topic the alarms notify. Default: none.
      log_retention: Default: one month.
    Lifecycle
      destroy_data_on_delete: ``cdk destroy`` deletes the table and the bucket's objects. Default: False (retain).
    """

    tenants: Mapping[str, TenantPlan] = field(default_factory=lambda: {"demo": TenantPlan()})
    api_stage_name: str = "prod"
    create_api_gateway_cloudwatch_role: bool = True
    waf_requests_per_5_min_per_ip: int | None = None
    request_limits: RequestLimits = RequestLimits()
    retention_days: int = settings.PAYLOAD_RETENTION_DAYS
    cors_allowed_origins: Sequence[str] = ("*",)
    subscriptions: Sequence[TopicSubscription] = ()
    event_rules: Sequence[EventRule] = ()
    eventbridge_events: bool = False
    websocket_push: bool = True
    progress_interval_s: int = int(settings.PROGRESS_INTERVAL_S)
    model: str = DEFAULT_MODEL
    models: Sequence[ModelSpec] = ()
    tool_call_parser: str | None = None
    model_source: str = "huggingface"
    model_s3_uri: str | None = None
    hf_token_secret_arn: str | None = None
    max_num_seqs: int | None = None
    planned_sequence_tokens: int | None = None
    gpu_instance_type: str = "g5.xlarge"
    gpu_ami_parameter_name: str | None = None
    gpus_per_instance: int = 1
    max_gpu_instances: int = 2
    max_worker_tasks: int = 2
    deployment_spare_instances: int = 0
    worker_memory_reservation_mib: int = 12288
    gpu_instance_warmup_seconds: int = int(INSTANCE_WARMUP.to_seconds())
    gpu_warm_pool_instances: int | None = None
    release_empty_gpu_instances: bool = True
    worker_task_protection: str = DEFAULT_TASK_PROTECTION
    worker_task_protection_tokens_per_s: float = DEFAULT_TASK_PROTECTION_TOKENS_PER_S
    worker_image_context: Path = PROJECT_ROOT
    worker_dockerfile: str = "gpu_worker/Dockerfile"
    nat_gateways: int = 1
    worker_subnets: str = "private"
    availability_zones: Sequence[str] = ()
    jobs_per_task: float | None = None
    scale_out_cooldown_seconds: int = 60
    scale_in_fill: float = 0.5
    scale_in_minutes: int = 3
    scale_in_cooldown_seconds: int = 120
    idle_minutes_before_scale_in: int = 3
    wake_from_zero: bool = True
    wake_check_interval_seconds: int = DEFAULT_WAKE_CHECK_INTERVAL_S
    wake_hold_seconds: int = DEFAULT_WAKE_HOLD_S
    oldest_message_alarm_seconds: int = 900
    alarm_topic_arn: str | None = None
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    destroy_data_on_delete: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the options that cannot hold together."""
        positive = (
            "gpus_per_instance",
            "max_gpu_instances",
            "max_worker_tasks",
            "retention_days",
            "scale_in_minutes",
            "idle_minutes_before_scale_in",
            "wake_check_interval_seconds",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_worker_tasks > self.max_gpu_instances * self.gpus_per_instance:
            raise ValueError(
                f"max_worker_tasks ({self.max_worker_tasks}) exceeds max_gpu_instances ({self.max_gpu_instances}) x "
                f"gpus_per_instance ({self.gpus_per_instance}): each task needs a GPU, the extra tasks could never run"
            )
        if is_arm64(self.gpu_instance_type) and not self.gpu_ami_parameter_name:
            raise ValueError(
                f"gpu_instance_type ({self.gpu_instance_type}) is arm64, and ECS publishes its GPU-optimized AMI for "
                "x86_64 only: set gpu_ami_parameter_name to an SSM parameter holding an arm64 AMI with the NVIDIA "
                "driver and the ECS agent, or choose an x86_64 type (g5, g6)"
            )
        if self.progress_interval_s < 0:
            raise ValueError(f"progress_interval_s must be 0 (no progress) or more, got {self.progress_interval_s}")
        if self.deployment_spare_instances < 0:
            raise ValueError(f"deployment_spare_instances must be 0 or more, got {self.deployment_spare_instances}")
        spare_gpus = self.max_gpu_instances * self.gpus_per_instance - self.max_worker_tasks
        if self.deployment_spare_instances and spare_gpus < self.deployment_spare_instances * self.gpus_per_instance:
            raise ValueError(
                f"deployment_spare_instances ({self.deployment_spare_instances}) needs that many instances beyond "
                f"max_worker_tasks ({self.max_worker_tasks}) in max_gpu_instances ({self.max_gpu_instances}) x "
                f"gpus_per_instance ({self.gpus_per_instance}): at full load a start-before-stop deployment would wait "
                "for a GPU no instance has. Raise max_gpu_instances or set deployment_spare_instances to 0 "
                "(stop-before-start)"
            )
        if self.retention_days * 86400 < settings.MAX_TTL_S:
            raise ValueError(
                f"retention_days ({self.retention_days}) is shorter than settings.MAX_TTL_S "
                f"({settings.MAX_TTL_S // 86400} days): a queued job's request would expire before the job does"
            )
        self._validate_model_source()
        if self.worker_subnets not in WORKER_SUBNETS:
            raise ValueError(f"worker_subnets ({self.worker_subnets!r}) must be one of {', '.join(WORKER_SUBNETS)}")
        if self.worker_subnets == "private" and self.nat_gateways < 1:
            raise ValueError(
                f"nat_gateways ({self.nat_gateways}) leaves the GPU workers in private subnets without a "
                "route to SQS, SNS and the model hub: set worker_subnets to 'public' to run without NAT"
            )
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ValueError(f"availability_zones {list(self.availability_zones)} names a zone twice")
        if not 60 <= self.oldest_message_alarm_seconds < 14 * 86400:
            raise ValueError(
                f"oldest_message_alarm_seconds ({self.oldest_message_alarm_seconds}) must lie between 60 s and the "
                "queue's 14-day retention"
            )
        if not (self.worker_image_context / self.worker_dockerfile).is_file():
            raise ValueError(
                f"worker_dockerfile ({self.worker_dockerfile}) not found in worker_image_context "
                f"({self.worker_image_context})"
            )
        self._validate_scaling()
        self._validate_models()
        validate_rules(self.event_rules, list(self.tenants), [spec.name for spec in self.model_specs()])

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """Every model the stack serves, the first one first; without ``models``, ``model`` with the stack's options."""
        if self.models:
            return tuple(self.models)
        return (
            ModelSpec(
                name=self.model,
                source=self.model_source,
                s3_uri=self.model_s3_uri,
                instance_type=self.gpu_instance_type,
                max_worker_tasks=self.max_worker_tasks,
                max_gpu_instances=self.max_gpu_instances,
                max_num_seqs=self.max_num_seqs,
                jobs_per_task=self.jobs_per_task,
                tool_call_parser=self.tool_call_parser,
            ),
        )

    def for_model(self, spec: ModelSpec) -> AsyncInferenceServiceProps:
        """These options as one model's fleet sees them: its entry's fields over the stack's (``models`` empty)."""

        def given(value, default):  # noqa: ANN001, ANN202
            return default if value is None else value

        return dataclasses.replace(
            self,
            model=spec.name,
            models=(),
            model_source=given(spec.source, self.model_source),
            model_s3_uri=spec.s3_uri if self.models else self.model_s3_uri,
            gpu_instance_type=given(spec.instance_type, self.gpu_instance_type),
            max_worker_tasks=given(spec.max_worker_tasks, self.max_worker_tasks),
            max_gpu_instances=given(spec.max_gpu_instances, self.max_gpu_instances),
            max_num_seqs=given(spec.max_num_seqs, self.max_num_seqs),
            planned_sequence_tokens=None if spec.max_num_seqs is not None else self.planned_sequence_tokens,
            jobs_per_task=given(spec.jobs_per_task, self.jobs_per_task),
            tool_call_parser=given(spec.tool_call_parser, self.tool_call_parser),
        )

    def _validate_models(self) -> None:
        if not self.models:
            return
        if len(self.models) > MAX_MODELS:
            raise ValueError(
                f"models lists {len(self.models)} models; at most {MAX_MODELS} fit the functions' environment"
            )
        names = [spec.name for spec in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models names a model twice: {names}")
        if self.models[0].name != self.model:
            raise ValueError(
                f"models starts with {self.models[0].name!r} but model is {self.model!r}: the first model is the one "
                "`model` names (its fleet keeps the one-model stack's resources); set model to it"
            )
        for spec in self.models:
            spec.validate()
            try:
                self.for_model(spec).validate()
            except ValueError as exc:
                raise ValueError(f"models: {spec.name}: {exc}") from exc
        slugs = [spec.slug for spec in self.models]
        if len(set(slugs)) != len(slugs):
            raise ValueError(f"models {names} give the same ECS service name suffix twice ({slugs}): rename one")

    def effective_tool_call_parser(self) -> str | None:
        """``tool_call_parser``, or the one ``TOOL_CALL_PARSERS`` names for ``model``."""
        if self.tool_call_parser is not None:
            return self.tool_call_parser
        return next((parser for prefix, parser in TOOL_CALL_PARSERS.items() if self.model.startswith(prefix)), None)

    def effective_max_num_seqs(self) -> int:
        """``max_num_seqs``, or the sizing rule's value for ``model`` on ``gpu_instance_type``."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        tokens = self.planned_sequence_tokens or capacity.DEFAULT_SEQUENCE_TOKENS
        try:
            return capacity.sized_max_num_seqs(self.model, self.gpu_instance_type, sequence_tokens=tokens)
        except KeyError as exc:
            raise ValueError(f"max_num_seqs is not set and cannot be sized: {exc.args[0]}; set max_num_seqs") from exc
        except ValueError as exc:
            raise ValueError(f"planned_sequence_tokens ({tokens}): {exc}") from exc

    def effective_jobs_per_task(self) -> float:
        """``jobs_per_task``, or the batch (``JOBS_PER_TASK_IN_BATCHES`` batches)."""
        if self.jobs_per_task is not None:
            return self.jobs_per_task
        return JOBS_PER_TASK_IN_BATCHES * self.effective_max_num_seqs()

    def _validate_scaling(self) -> None:
        if self.max_num_seqs is not None and self.planned_sequence_tokens is not None:
            raise ValueError(
                f"planned_sequence_tokens ({self.planned_sequence_tokens}) conflicts with max_num_seqs "
                f"({self.max_num_seqs}): the tokens only size max_num_seqs when it is not given; drop one"
            )
        if self.effective_max_num_seqs() < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.effective_max_num_seqs()}")
        if self.effective_jobs_per_task() < 1:
            raise ValueError(f"jobs_per_task must be at least 1, got {self.effective_jobs_per_task():g}")
        if not 0 < self.scale_in_fill <= 1:
            raise ValueError(
                f"scale_in_fill ({self.scale_in_fill:g}) must lie in (0, 1]: above 1 the step-down "
                "would remove a task that the scale-out, at jobs_per_task, adds back"
            )
        for name in (
            "scale_out_cooldown_seconds",
            "scale_in_cooldown_seconds",
            "gpu_instance_warmup_seconds",
            "wake_hold_seconds",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        pool = self.gpu_warm_pool_instances
        if pool is not None and not 0 <= pool <= self.max_gpu_instances:
            raise ValueError(
                f"gpu_warm_pool_instances ({pool}) must lie in 0..max_gpu_instances "
                f"({self.max_gpu_instances}): the pool holds instances the group may start"
            )
        if self.worker_task_protection not in TASK_PROTECTION_MODES:
            raise ValueError(
                f"worker_task_protection ({self.worker_task_protection!r}) must be one of "
                f"{', '.join(TASK_PROTECTION_MODES)}"
            )
        if self.worker_task_protection_tokens_per_s <= 0:
            raise ValueError(
                f"worker_task_protection_tokens_per_s ({self.worker_task_protection_tokens_per_s:g}) must be positive"
            )

    def _validate_model_source(self) -> None:
        if self.model_source not in MODEL_SOURCES:
            raise ValueError(f"model_source ({self.model_source!r}) must be one of {', '.join(MODEL_SOURCES)}")
        if self.model_s3_uri is not None and self.model_source != "s3":
            raise ValueError(
                f"model_s3_uri ({self.model_s3_uri}) conflicts with model_source ({self.model_source!r}): the weights "
                "would come from Hugging Face and the prefix be ignored; set model_source to 's3' or drop model_s3_uri"
            )
        if self.model_s3_uri is not None:
            try:
                parse_s3_uri(self.model_s3_uri)
            except ValueError as exc:
                raise ValueError(f"model_s3_uri: {exc}") from exc
        if self.hf_token_secret_arn is not None and self.model_source != "huggingface":
            raise ValueError(
                f"hf_token_secret_arn conflicts with model_source ({self.model_source!r}): the weights come from S3, "
                "so no Hugging Face token is used; drop hf_token_secret_arn or set model_source to 'huggingface'"
            )
        if self.hf_token_secret_arn is not None and not re.match(SECRET_ARN_PATTERN, self.hf_token_secret_arn):
            raise ValueError(
                f"hf_token_secret_arn ({self.hf_token_secret_arn}) is not a complete Secrets Manager secret ARN "
                "(arn:aws:secretsmanager:<region>:<account>:secret:<name>-<6 characters>)"
            )


class AsyncInferenceService(Construct):
    """The asynchronous inference service: API, claim-check bucket, queue, table, topics, webhooks, GPU workers.

    The constructs of each concern are exposed as attributes (``bucket``, ``jobs``, ``table``, ``results``,
    ``webhooks``, ``api``, ``uploads``, ``upload_deadlines``, ``dead_letters``, ``workers``, ``scaling``,
    ``monitoring``, ``push``: None without ``websocket_push``). Every
    permission below is a ``grant_*`` on the one resource it concerns; the runtime configuration is injected into
    each function and the worker from ``ServiceConfig``, the same class the code reads it with.
    """

    def __init__(self, scope: Construct, id: str, *, props: AsyncInferenceServiceProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or AsyncInferenceServiceProps()
        props.validate()
        removal = RemovalPolicy.DESTROY if props.destroy_data_on_delete else RemovalPolicy.RETAIN

        self.bucket = ClaimCheckBucket(
            self,
            "ClaimChecks",
            retention_days=props.retention_days,
            cors_allowed_origins=props.cors_allowed_origins,
            removal_policy=removal,
        )
        self.jobs = JobQueue(self, "Jobs")
        self.table = JobTable(self, "JobTable", removal_policy=removal)
        self.results = ResultTopics(self, "Results", subscriptions=props.subscriptions, tenants=list(props.tenants))

        runtime = ServiceConfig(
            table_name=self.table.table.table_name,
            bucket_name=self.bucket.bucket.bucket_name,
            queue_url=self.jobs.queue.queue_url,
            topic_arn=self.results.topic.topic_arn,
            dlq_url=self.jobs.dead_letter_queue.queue_url,
            payload_retention_days=props.retention_days,
        ).to_env()
        # Each fleet's workers serve their model under its name (vLLM's served_model_name defaults to it): every
        # function checks requests against the names, so a job or batch line for another model is a 404.
        environment = {
            **runtime,
            "POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE,
            ENV_SERVED_MODELS: json.dumps([spec.name for spec in props.model_specs()]),
        }
        if props.request_limits != RequestLimits():  # unset: every process holds requests to the defaults
            environment[ENV_REQUEST_LIMITS] = props.request_limits.model_dump_json()

        code = LambdaCode(self, "LambdaCode", project_root=PROJECT_ROOT, log_retention=props.log_retention)
        self.upload_deadlines = UploadDeadlines(self, "UploadDeadlines", code=code, environment=environment)
        self.batches = Batches(self, "Batches", code=code, environment=environment, removal_policy=removal)
        self.api = IngestionApi(
            self,
            "Ingestion",
            code=code,
            # The API schedules each upload's deadline, stores files and batches and sends plan steps.
            environment={**environment, **self.upload_deadlines.environment, **self.batches.environment},
            tenants=props.tenants,
            stage_name=props.api_stage_name,
            log_retention=props.log_retention,
            create_cloudwatch_role=props.create_api_gateway_cloudwatch_role,
            waf_requests_per_5_min_per_ip=props.waf_requests_per_5_min_per_ip,
        )
        self.uploads = UploadIntake(
            self,
            "Uploads",
            code=code,
            bucket=self.bucket.bucket,
            # Upload jobs submitted with priority "batch" are queued on the batch lane once their upload arrives; a
            # file upload's bytes are checked against its record in the batch table.
            environment={**environment, **self.batches.environment},
        )
        self.dead_letters = DeadLetterHandler(
            self,
            "DeadLetters",
            code=code,
            dead_letter_queue=self.jobs.dead_letter_queue,
            environment={**environment, **self.batches.environment},
            lane_dead_letter_queue=self.batches.lane_dead_letter_queue,
        )
        self.webhooks = WebhookDispatch(
            self,
            "Webhooks",
            code=code,
            topic=self.results.topic,
            tenants=list(props.tenants),
            # Batch webhooks: the dispatcher reads the batch's webhook and records its attempts in the batch table.
            environment={**environment, ENV_BATCH_TABLE: self.batches.table.table_name},
        )
        self.push: WebSocketPush | None = None
        if props.websocket_push:
            self.push = WebSocketPush(
                self,
                "Push",
                code=code,
                result_topic=self.results.topic,
                topic_key=self.results.key,
                api_keys=self.api.api_keys,
                environment={"POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE},
                stage_name=props.api_stage_name,
                log_retention=props.log_retention,
            )
            # Stage access logs need the account's API Gateway logging role, which the REST API sets up.
            self.push.stage.node.add_dependency(self.api.api)
        specs = props.model_specs()
        first = props.for_model(specs[0])
        model_environment, model_secrets = self._model_source(first, removal)
        self.workers = GpuWorkerService(
            self,
            "Workers",
            environment=self._worker_environment(first, specs[0], environment, model_environment),
            secrets=model_secrets,
            **self._worker_options(first),
        )
        self.scaling = QueueScaling(
            self,
            "Scaling",
            service=self.workers.service,
            # A batch-lane message is a chunk of BATCH_CHUNK_LINES lines (or one job submitted with priority batch:
            # counting it as a full chunk over-provisions by at most one task's share while such jobs wait).
            queues=[
                CountedQueue(self.jobs.queue),
                CountedQueue(self.batches.lane_queue, weight=settings.BATCH_CHUNK_LINES),
            ],
            **self._scaling_options(first),
        )
        self.capacity = GpuCapacity(
            self,
            "GpuCapacity",
            auto_scaling_group=self.workers.auto_scaling_group,
            cluster=self.workers.cluster,
            container=self.workers.container,
            code=code,
            warm_instances=self._warm_instances(first),
            release_empty=props.release_empty_gpu_instances,
            model=props.model,  # the pool's instances fetch the weights before they are stopped
            models=self.models,
        )
        self.fleets = [self._fleet(props.for_model(spec), spec, environment, code, removal) for spec in specs[1:]]
        for fleet in self.fleets:
            # Their dead letters fail their jobs and end their chunks as the first fleet's do.
            self.dead_letters.consume(fleet.jobs.dead_letter_queue)
            self.dead_letters.consume(fleet.lane_dead_letter_queue)
            if self.capacity.release_function is not None:
                self._grant_release(self.capacity.release_function, fleet.workers.auto_scaling_group)
        self.state_events: StateEvents | None = None
        if props.eventbridge_events:
            self.state_events = StateEvents(
                self,
                "StateEvents",
                code=code,
                result_topic=self.results.topic,
                events_topic=self.push.events_topic if self.push else None,
                environment={"POWERTOOLS_METRICS_NAMESPACE": settings.METRICS_NAMESPACE},
            )
        self.events_in: EventsIn | None = None
        if props.event_rules:
            self.events_in = EventsIn(
                self,
                "EventsIn",
                code=code,
                bucket=self.bucket.bucket,
                rules=props.event_rules,
                environment={**environment, **self.batches.environment},
            )
        # Every function that queues work routes it by its model (async_inference.fleets): the API (jobs, responses),
        # the upload handler (uploaded jobs), the batch controller (chunks) and events in (jobs).
        queuing = [self.api.handler, self.uploads.handler, self.batches.controller]
        if self.events_in is not None:
            queuing.append(self.events_in.handler)
        routes = Stack.of(self).to_json_string(self._routes(specs[0], props.wake_from_zero))
        for function in queuing:
            function.add_environment(ENV_MODEL_FLEETS, routes)
        if props.wake_from_zero:
            # Both functions that queue jobs: the API (inline jobs) and the upload handler (uploaded ones).
            self.scaling.grant_wake(self.api.handler)
            self.scaling.grant_wake(self.uploads.handler)
            self.scaling.grant_wake(self.batches.controller)  # it queues the chunks
            if self.events_in is not None:
                self.scaling.grant_wake(self.events_in.handler)
            # A wake also starts the GPU instance at once, instead of after managed scaling's next minute.
            for function in queuing:
                self.capacity.grant_instance_start(function)
            for fleet in self.fleets:  # their services and groups are in the routes, not in the wake's variables
                for function in queuing:
                    fleet.scaling.grant_wake(function, environment=False)
                    fleet.capacity.grant_instance_start(function, environment=False)
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            queue=self.jobs.queue,
            dead_letter_queues={
                "JobDeadLetterQueue": self.jobs.dead_letter_queue,
                "WebhookDeadLetterQueue": self.webhooks.dead_letter_queue,
                "SubscriptionDeadLetterQueue": self.results.subscription_dead_letter_queue,
                "UploadFailureQueue": self.uploads.failure_queue,
                "UploadDeadlineDeadLetterQueue": self.upload_deadlines.dead_letter_queue,
                "BatchLaneDeadLetterQueue": self.batches.lane_dead_letter_queue,
                "BatchControlDeadLetterQueue": self.batches.control_dead_letter_queue,
                "UnhandledDeadLetterQueue": self.dead_letters.unhandled_queue,
                **({"EventsInFailureQueue": self.events_in.failure_queue} if self.events_in else {}),
                **{
                    f"{kind}DeadLetterQueue{fleet.spec.construct_id}": queue
                    for fleet in self.fleets
                    for kind, queue in (("Job", fleet.jobs.dead_letter_queue), ("Lane", fleet.lane_dead_letter_queue))
                },
            },
            service=self.workers.service,
            fleets=[
                MonitoredFleet(fleet.spec.name, fleet.spec.construct_id, fleet.jobs.queue, fleet.workers.service)
                for fleet in self.fleets
            ],
            worker_service_name=self.workers.service_name,
            api_service_name=self.api.service_name,
            dead_letter_service_name=self.dead_letters.service_name,
            oldest_message_alarm_age=Duration.seconds(props.oldest_message_alarm_seconds),
            alarm_topic=sns.Topic.from_topic_arn(self, "AlarmTopic", props.alarm_topic_arn)
            if props.alarm_topic_arn
            else None,
        )
        self._grant()

    def _worker_environment(
        self,
        props: AsyncInferenceServiceProps,
        spec: ModelSpec,
        environment: Mapping[str, str],
        model_environment: Mapping[str, str],
    ) -> dict[str, str]:
        """A model's worker container variables (``props`` as ``for_model`` gives them); its own queues are the
        caller's to set."""
        return {
            **environment,
            "ENGINE": "vllm",
            "MODEL": props.model,
            ENV_MODEL_KIND: spec.kind,
            ENV_SERVED_MODELS: json.dumps([props.model]),  # its own model only: a batch line for another is a 404
            **({ENV_TOOL_CALL_PARSER: parser} if (parser := props.effective_tool_call_parser()) else {}),
            **model_environment,
            "MAX_NUM_SEQS": str(props.effective_max_num_seqs()),
            ENV_WEBHOOK_QUEUE_URL: self.webhooks.queue.queue_url,  # "started" events
            **self.batches.environment,  # the batch lane, its counters and finalize steps
            ENV_PROGRESS_INTERVAL_S: str(props.progress_interval_s),
            **(self.push.worker_environment if self.push else {}),  # started and progress events
        }

    def _worker_options(self, props: AsyncInferenceServiceProps) -> dict[str, Any]:
        """``GpuWorkerService``'s options for a model (``props`` as ``for_model`` gives them)."""
        if props.gpu_ami_parameter_name and not hasattr(self, "_machine_image"):
            self._machine_image = ec2.MachineImage.from_ssm_parameter(props.gpu_ami_parameter_name)
        return {
            "image_context": props.worker_image_context,
            "dockerfile": props.worker_dockerfile,
            "instance_type": props.gpu_instance_type,
            "machine_image": self._machine_image if props.gpu_ami_parameter_name else None,
            "max_instances": props.max_gpu_instances,
            "start_before_stop": props.deployment_spare_instances > 0,
            "instance_warmup": Duration.seconds(props.gpu_instance_warmup_seconds),
            "task_protection": props.worker_task_protection,
            "task_protection_tokens_per_s": props.worker_task_protection_tokens_per_s,
            "memory_reservation_mib": props.worker_memory_reservation_mib,
            "nat_gateways": props.nat_gateways,
            "public_subnets": props.worker_subnets == "public",
            "availability_zones": props.availability_zones,
            "log_retention": props.log_retention,
        }

    @classmethod
    def _scaling_options(cls, props: AsyncInferenceServiceProps) -> dict[str, Any]:
        """``QueueScaling``'s options for a model but its service and queues. With a warm pool of fewer instances than
        its most tasks, a wake's hold also keeps the maximum at the tasks the pool can start, until the pool's
        replacement is ready."""
        return {
            "jobs_per_task": props.effective_jobs_per_task(),
            "max_tasks": props.max_worker_tasks,
            "scale_out_cooldown": Duration.seconds(props.scale_out_cooldown_seconds),
            "scale_in_fill": props.scale_in_fill,
            "scale_in_minutes": props.scale_in_minutes,
            "scale_in_cooldown": Duration.seconds(props.scale_in_cooldown_seconds),
            "keep_alive_minutes": props.idle_minutes_before_scale_in,
            "wake_check_interval": Duration.seconds(props.wake_check_interval_seconds),
            "wake_hold": Duration.seconds(props.wake_hold_seconds),
            "wake_hold_maximum": cls._hold_maximum(props),
        }

    @classmethod
    def _hold_maximum(cls, props: AsyncInferenceServiceProps) -> int | None:
        """The most tasks a wake's hold allows: one per pooled instance, when the pool starts fewer than the most
        tasks (None: the hold raises the minimum only; without a pool a further task comes from a fresh instance
        whenever it is asked for)."""
        pool = cls._warm_instances(props)
        return pool if 0 < pool < props.max_worker_tasks else None

    @staticmethod
    def _warm_instances(props: AsyncInferenceServiceProps) -> int:
        pool = props.gpu_warm_pool_instances
        return min(DEFAULT_WARM_POOL_INSTANCES if pool is None else pool, props.max_gpu_instances)

    def _fleet(
        self,
        props: AsyncInferenceServiceProps,
        spec: ModelSpec,
        environment: Mapping[str, str],
        code: LambdaCode,
        removal: RemovalPolicy,
    ) -> ModelFleet:
        """A further model's fleet (``props`` as ``for_model`` gives them), its worker on its own queues."""
        model_environment, secrets, store = self._model_store(props, removal, f"Models{spec.construct_id}")
        worker_environment = self._worker_environment(props, spec, environment, model_environment)
        fleet = ModelFleet(
            self,
            spec.construct_id,
            spec=spec,
            shared_with=self.workers,
            code=code,
            worker_environment=worker_environment,
            secrets=secrets,
            worker_options=self._worker_options(props),
            scaling_options=self._scaling_options(props),
            warm_instances=self._warm_instances(props),
            models=store,
        )
        fleet.workers.container.add_environment(ENV_QUEUE_URL, fleet.jobs.queue.queue_url)
        fleet.workers.container.add_environment(ENV_DLQ_URL, fleet.jobs.dead_letter_queue.queue_url)
        fleet.workers.container.add_environment(ENV_BATCH_QUEUE_URL, fleet.lane_queue.queue_url)
        self.fleet_models[spec.name] = store
        return fleet

    def _grant_release(self, function: lambda_.Function, group: autoscaling.AutoScalingGroup) -> None:
        """The first fleet's release function releases every empty instance of the cluster it shares with the further
        fleets (it reads the groups from the cluster's capacity providers): the same calls on their groups as on its
        own (cdk.gpu_capacity.GpuCapacity)."""
        stack = Stack.of(self)
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["autoscaling:SetInstanceProtection", "autoscaling:SetDesiredCapacity"],
                resources=[
                    stack.format_arn(
                        service="autoscaling",
                        resource="autoScalingGroup",
                        resource_name=f"*:autoScalingGroupName/{group.auto_scaling_group_name}",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        group_id = stack.get_logical_id(group.node.default_child)
        acknowledge(
            function,
            {
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{rendered_account(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/<{group_id}>]": "An Auto Scaling group's ARN holds a "
                "generated id; the statement names a further model's GPU group by name.",
            },
        )

    def _routes(self, first: ModelSpec, wake: bool) -> dict[str, dict[str, str | int]]:
        """MODEL_FLEETS (``async_inference.fleets.FleetRoute`` per model), with the stack's tokens."""
        routes = {
            first.name: {
                "kind": first.kind,
                "queue_url": self.jobs.queue.queue_url,
                "batch_queue_url": self.batches.lane_queue.queue_url,
                **(self._wake_route(self.scaling, self.capacity) if wake else {}),
            }
        }
        for fleet in self.fleets:
            routes[fleet.spec.name] = {
                "kind": fleet.spec.kind,
                "queue_url": fleet.jobs.queue.queue_url,
                "batch_queue_url": fleet.lane_queue.queue_url,
                **(self._wake_route(fleet.scaling, fleet.capacity) if wake else {}),
            }
        return routes

    @staticmethod
    def _wake_route(scaling: QueueScaling, capacity: GpuCapacity) -> dict[str, str | int]:
        """What a route needs to wake its fleet from zero: its service, the hold's bounds when the hold keeps a
        maximum (the maximum while it lasts, and the one its end restores), and the GPU group an instance starts in."""
        target = scaling.wake_target
        held = {"worker_hold_max_tasks": target.hold_max_tasks, "worker_max_tasks": target.max_tasks}
        return {
            "worker_service": target.service,
            **({} if target.hold_max_tasks is None else held),
            "worker_group": capacity.auto_scaling_group.auto_scaling_group_name,
        }

    def _model_source(
        self, props: AsyncInferenceServiceProps, removal: RemovalPolicy
    ) -> tuple[dict[str, str], dict[str, ecs.Secret]]:
        """The worker's model variables and secrets for ``props.model_source``; sets ``self.models`` (S3 only)."""
        self.fleet_models: dict[str, ModelStore | None] = {}
        model_environment, secrets, self.models = self._model_store(props, removal, "Models")
        return model_environment, secrets

    def _model_store(
        self, props: AsyncInferenceServiceProps, removal: RemovalPolicy, id: str
    ) -> tuple[dict[str, str], dict[str, ecs.Secret], ModelStore | None]:
        """A model's worker variables and secrets for ``props.model_source``, and its store (S3 only)."""
        if props.model_source == "s3":
            store = ModelStore(
                self,
                id,
                model=props.model,
                models_path=MODELS_CONTAINER_PATH,
                existing_uri=props.model_s3_uri,
                access_logs=self.bucket.access_logs,
                removal_policy=removal,
            )
            return dict(store.environment), {}, store
        if props.hf_token_secret_arn:
            token = self.node.try_find_child("HuggingFaceToken") or secretsmanager.Secret.from_secret_complete_arn(
                self, "HuggingFaceToken", props.hf_token_secret_arn
            )
            return {}, {"HF_TOKEN": ecs.Secret.from_secrets_manager(token)}, None  # type: ignore[arg-type]
        return {}, {}, None

    def _grant(self) -> None:
        """Each principal gets exactly the calls its code makes (async_inference.aws, service.py, lambdas/*,
        gpu_worker/worker.py), on the resources and key prefixes it makes them on."""
        bucket, table, results, queue = self.bucket, self.table, self.results, self.jobs.queue
        self._acknowledge_grant_wildcards()
        requests, uploads, result_objects = settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX

        # The API: submit (get, create, transition on a failed enqueue), get (lazy expiry), list, cancel (notifies).
        api = self.api.handler
        table.grant_items(api, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        table.grant_tenant_listing(api)
        bucket.grant_put(api, requests)  # inline bodies
        bucket.grant_put(api, uploads)  # presigned upload PUTs are signed with the function's role
        bucket.grant_get(api, result_objects, missing_as_404=False)  # presigned result GETs likewise
        # Background responses: the Responses body beside each response's job's request, read and deleted by the API;
        # deleting a response deletes its job too (its record, request and result).
        bucket.grant_get(api, RESPONSES_BODIES)
        bucket.grant_delete(api, RESPONSES_BODIES, requests, result_objects)
        table.grant_items(api, "dynamodb:DeleteItem")
        queue.grant(api, "sqs:SendMessage")
        self.upload_deadlines.queue.grant(api, "sqs:SendMessage")  # each upload job's deadline
        results.grant_publish(api)  # cancels and expiries notify

        # The upload handler: check the object, queue its job or fail it, notify.
        upload = self.uploads.handler
        table.grant_items(upload, "dynamodb:GetItem", "dynamodb:UpdateItem")
        bucket.grant_get(upload, uploads)
        bucket.grant_delete(upload, uploads)  # objects no job asked for, oversize bodies, accepted uploads
        bucket.grant_put(upload, requests)  # an accepted upload's checked bytes, out of reach of its presigned URL
        queue.grant(upload, "sqs:SendMessage")
        results.grant_publish(upload)
        # A file upload whose file was deleted before its bytes arrived: its record read, its object deleted.
        self.batches.grant_items(upload, "dynamodb:GetItem")
        bucket.grant_delete(upload, FILE_UPLOADS)

        # The DLQ handler (its event source grants consuming the DLQ): fail the job, notify.
        dead_letters = self.dead_letters.handler
        table.grant_items(dead_letters, "dynamodb:GetItem", "dynamodb:UpdateItem")
        results.grant_publish(dead_letters)

        # The upload-deadline handler (its event source grants consuming, and hiding, its queue's messages).
        deadlines = self.upload_deadlines.handler
        table.grant_items(deadlines, "dynamodb:GetItem", "dynamodb:UpdateItem")
        results.grant_publish(deadlines)

        # The webhook dispatcher (its event source grants consuming, and hiding, its queue's messages).
        webhook = self.webhooks.handler
        table.grant_items(webhook, "dynamodb:GetItem", "dynamodb:UpdateItem")  # record_webhook_attempt
        self.webhooks.grant_read_signing_secrets(webhook)

        self._grant_worker(self.workers, queue, self.batches.lane_queue, self.models)
        for fleet in self.fleets:
            # A further model's fleet: its queues take the API's and the upload handler's jobs and the controller's
            # chunks; its worker gets what the first fleet's does, on its own queues and model.
            for function in (api, upload):
                fleet.jobs.queue.grant(function, "sqs:SendMessage")
                fleet.lane_queue.grant(function, "sqs:SendMessage")
            fleet.lane_queue.grant(self.batches.controller, "sqs:SendMessage")
            self._grant_worker(fleet.workers, fleet.jobs.queue, fleet.lane_queue, self.fleet_models[fleet.spec.name])
        self._grant_batches()
        if self.events_in is not None:
            self._grant_events_in(self.events_in.handler)

    def _grant_events_in(self, function: lambda_.Function) -> None:
        """The events-in function: read the objects under the inbox, then what the API does to submit a job (its
        record, its body, its claim check on any model's queue, a notification when it cannot be queued) or to
        create a batch (the file copied from the object, the file and batch records, the plan step)."""
        bucket, table, batches = self.bucket, self.table, self.batches
        bucket.grant_get(function, settings.INBOX_PREFIX)
        table.grant_items(function, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        bucket.grant_put(function, settings.REQUEST_PREFIX)  # job bodies, and the markers of objects taken in
        bucket.grant_get(function, settings.REQUEST_PREFIX, missing_as_404=False)  # a marker already there
        self.jobs.queue.grant(function, "sqs:SendMessage")
        batches.lane_queue.grant(function, "sqs:SendMessage")
        for fleet in self.fleets:
            fleet.jobs.queue.grant(function, "sqs:SendMessage")
            fleet.lane_queue.grant(function, "sqs:SendMessage")
        self.results.grant_publish(function)
        batches.grant_items(function, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        bucket.grant_put(function, settings.FILE_PREFIX)
        bucket.grant_get(function, settings.FILE_PREFIX, missing_as_404=False)
        batches.control_queue.grant(function, "sqs:SendMessage")

    def _grant_worker(
        self, workers: GpuWorkerService, queue: sqs.IQueue, lane: sqs.IQueue, models: ModelStore | None
    ) -> None:
        """A fleet's worker: its job queue and batch lane, its model, and the shared resources."""
        bucket, table, results = self.bucket, self.table, self.results
        requests, uploads, result_objects = settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX
        # Receive, extend and delete claim checks, and send back to the tail those of a tenant at its share
        # (gpu_worker.fairness); read payloads; write results (reading one back when an earlier run wrote it first);
        # check cancellations in batches; notify; queue "started" events.
        worker = workers.task_definition.task_role
        queue.grant(worker, "sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:SendMessage")
        bucket.grant_get(worker, requests, uploads, result_objects)
        bucket.grant_put(worker, result_objects)
        table.grant_items(worker, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem")
        results.grant_publish(worker)
        self.webhooks.queue.grant(worker, "sqs:SendMessage")
        if self.push is not None:
            self.push.grant_publish_events(worker)  # job.started, job.progress
        if models is not None:
            models.grant_read(worker)  # the model's prefix, nothing else of its bucket

        # The batch lane (docs/design/batches.md): receive, extend and delete chunk claim checks, and send back to the
        # tail those its fair scout steps over (gpu_worker.fairness); ranged reads of input files; write parts; the
        # batches' statuses (BatchGetItem) and chunk counts (UpdateItem, GetItem when already counted); finalize steps.
        batches, files, parts = self.batches, settings.FILE_PREFIX, settings.BATCH_PREFIX
        lane.grant(worker, "sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:SendMessage")
        bucket.grant_get(worker, files)
        bucket.grant_put(worker, parts)
        batches.grant_items(worker, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem")
        batches.control_queue.grant(worker, "sqs:SendMessage")

    def _grant_batches(self) -> None:
        """The Files and Batches APIs' principals (async_inference/batches/*, lambdas/batch_controller, and the
        worker's side of docs/design/batches.md)."""
        bucket, batches, files, parts = self.bucket, self.batches, settings.FILE_PREFIX, settings.BATCH_PREFIX

        # The API: file and batch records (create, read, confirm an upload, delete a file, cancel), the listings,
        # file bytes (inline uploads, presigned PUTs and GETs signed with its role, the HEAD that confirms an upload,
        # DeleteObject), plan steps.
        api = self.api.handler
        batches.grant_items(api, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")
        batches.grant_listing(api)
        batches.grant_quota_counts(api)
        bucket.grant_put(api, files)
        bucket.grant_get(api, files, missing_as_404=False)
        bucket.grant_delete(api, files)
        batches.control_queue.grant(api, "sqs:SendMessage")
        # Jobs submitted with priority "batch" (inline from the API, uploaded ones from the upload handler).
        batches.lane_queue.grant(api, "sqs:SendMessage")
        batches.lane_queue.grant(self.uploads.handler, "sqs:SendMessage")

        # The controller (its event source grants consuming the control queue): read inputs and parts, write output
        # and error files (multipart uploads: AbortMultipartUpload when one fails), send chunks, notify.
        controller = batches.controller
        batches.grant_items(controller, "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
        batches.grant_quota_counts(controller)  # a planned batch's lines against max_batch_lines_in_flight
        controller.add_environment(ENV_TENANT_QUOTAS, self.api.tenant_quotas)
        # The upload handler holds an uploaded request to its tenant's bounds on a request's cost.
        self.uploads.handler.add_environment(ENV_TENANT_QUOTAS, self.api.tenant_quotas)
        bucket.grant_get(controller, files, parts)
        bucket.grant_put(controller, files)
        bucket.grant_delete(controller, files)  # an output file that came out empty
        iam.Grant.add_to_principal(
            grantee=controller,
            actions=["s3:AbortMultipartUpload"],
            resource_arns=[bucket.bucket.arn_for_objects(f"{files}*")],
        )
        batches.lane_queue.grant(controller, "sqs:SendMessage")
        self.results.grant_publish(controller)

        # The workers' side: _grant_worker.

        # The webhook dispatcher, for batch webhooks: the batch's webhook, and each attempt recorded on it.
        batches.grant_items(self.webhooks.handler, "dynamodb:GetItem", "dynamodb:UpdateItem")

        # The DLQ handler, for dead-lettered chunks (its event source grants consuming the lane's DLQ): the chunk's
        # batch and its count, the input range and any results a worker stored, the parts, the finalize step.
        dead_letters = self.dead_letters.handler
        batches.grant_items(dead_letters, "dynamodb:GetItem", "dynamodb:UpdateItem")
        bucket.grant_get(dead_letters, files, parts)
        bucket.grant_put(dead_letters, parts)
        batches.control_queue.grant(dead_letters, "sqs:SendMessage")

    def _acknowledge_grant_wildcards(self) -> None:
        """The wildcards the grants above write: key prefixes of the claim-check bucket."""
        stack = Stack.of(self)
        bucket = stack.get_logical_id(self.bucket.bucket.node.default_child)
        findings = {
            f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/{prefix}*]": f"Objects under the {prefix} prefix only: keys "
            "hold tenant and job ids assigned at run time."
            for prefix in (
                settings.REQUEST_PREFIX,
                settings.UPLOAD_PREFIX,
                settings.RESULT_PREFIX,
                settings.FILE_PREFIX,
                settings.BATCH_PREFIX,
                RESPONSES_BODIES,
                FILE_UPLOADS,
                *((settings.INBOX_PREFIX,) if self.events_in is not None else ()),
            )
        }
        acknowledge(self, findings)
