"""The service's options: :class:`AsyncInferenceServiceProps` (every option documented and defaulted) and
:class:`ModelSpec` (one model of ``models``), and how one model's fleet reads them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aws_cdk import aws_logs as logs

from async_inference import settings
from async_inference.config import (
    DEFAULT_TASK_PROTECTION,
    DEFAULT_TASK_PROTECTION_TOKENS_PER_S,
    DEFAULT_WAKE_CHECK_INTERVAL_S,
    DEFAULT_WAKE_HOLD_S,
    TASK_PROTECTION_MODES,
)
from async_inference.fleets import CHAT, MODEL_KINDS
from async_inference.inbox import InboxRule
from async_inference.limits import RequestLimits
from cdk import capacity
from cdk.gpu_worker_service import INSTANCE_WARMUP, WORKER_ECS_SERVICE_NAME, is_arm64
from cdk.inbox import validate_rules
from cdk.ingestion_api import TenantPlan
from cdk.model_store import parse_s3_uri
from cdk.queue_scaling import JOBS_PER_TASK_IN_BATCHES
from cdk.result_topics import TopicSubscription

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
AMI_ID_PATTERN = r"^ami-([0-9a-f]{8}|[0-9a-f]{17})$"
SECRET_ARN_PATTERN = r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+-[A-Za-z0-9]{6}$"

# Every model's fleet is about 49 resources of the one stack's 500 (CloudFormation's quota), beside about 270 shared
# and 5 a tenant: `python -m cdk.limits` measures them (docs/deploying.md, "Tenants"). More models need the fleets in
# stacks of their own (fleet_stacks), which leaves 10 a model in the stack itself; there the API role's inline policy,
# which grows about 300 bytes a model, bounds them (10,025 of IAM's 10,240 at 8 models, with 100 tenants). (The routes
# are in the deployment's catalog, cdk.catalog, not in any environment.)
MAX_MODELS_IN_STACK = 4
MAX_MODELS = 8
MAX_SLUG_CHARS = 32


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One entry of the ``models`` context: a model and its fleet. Unset fields take the stack's own option of the
    name in brackets.

    :param name: the model's name, as requests name it (its Hugging Face id, or its name when the weights come from S3).
    :param kind: ``"chat"`` (chat completions, responses) or ``"embedding"`` (embeddings). Default: chat.
    :param source: where its weights come from, ``"huggingface"`` or ``"s3"`` (``model_source``).
    :param s3_uri: ``s3://bucket/prefix/`` of its uploaded weights, with ``source="s3"``; never taken from the stack's
        ``model_s3_uri`` (two models in one prefix). Default: none, the stack creates a bucket for it.
    :param instance_type: its GPU instance type (``gpu_instance_type``).
    :param max_worker_tasks: (``max_worker_tasks``). :param max_gpu_instances: (``max_gpu_instances``).
    :param max_num_seqs: (``max_num_seqs``; a model ``cdk.capacity`` has no shape for, an embedding model for one,
        must set it). :param jobs_per_task: (``jobs_per_task``). :param tool_call_parser: (``tool_call_parser``).
    """

    name: str
    kind: str = CHAT
    source: str | None = None
    s3_uri: str | None = None
    instance_type: str | None = None
    max_worker_tasks: int | None = None
    max_gpu_instances: int | None = None
    max_num_seqs: int | None = None
    jobs_per_task: float | None = None
    tool_call_parser: str | None = None

    def validate(self) -> None:
        if not self.name or self.name != self.name.strip():
            raise ValueError(f"models: name {self.name!r} must be a non-empty name without surrounding spaces")
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"models: {self.name} has kind {self.kind!r}; it must be one of {', '.join(MODEL_KINDS)}")

    @property
    def slug(self) -> str:
        """The model's own name (after its organization) as an ECS service name suffix: lowercase letters, digits
        and hyphens."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.split("/")[-1].lower()).strip("-")[:MAX_SLUG_CHARS].strip("-")

    @property
    def construct_id(self) -> str:
        return "Fleet" + "".join(part.capitalize() for part in self.slug.split("-"))

    @property
    def ecs_service_name(self) -> str:
        return f"{WORKER_ECS_SERVICE_NAME}-{self.slug}"


@dataclass(frozen=True, kw_only=True)
class AsyncInferenceServiceProps:
    """Options of :class:`AsyncInferenceService`. Every option has a default; :meth:`validate` rejects conflicts.

    Tenants and API
      tenants: tenant id -> usage plan (throttling, daily quota); one API key named by the tenant id each.
        Default: ``{"demo": TenantPlan()}``.
      api_stage_name: Default: ``"prod"``.
      create_api_gateway_cloudwatch_role: create the role API Gateway logs with and name it in the account's API
        Gateway settings, which are account-wide: an account that has one already would have it replaced for every
        API of the region (and a stack delete retains it). The preflight says which the account needs
        (``api_gateway_logging_role``). Default: False (the account's own role; a fresh account sets True once).
      request_limits: the bounds on one request's cost (json_schema size, depth and alternatives; the context
        length a prompt is checked against; n x max_tokens), ``async_inference.limits.RequestLimits``; a tenant's plan
        may change them (``TenantPlan.request_limits``). docs/limits.md has the table. Default: ``RequestLimits()``.
      waf_requests_per_5_min_per_ip: a WAF web ACL on the REST stage that blocks an IP address over this many
        requests in 5 minutes (authenticated or not) and requests from AWS's IP reputation list and with known bad
        inputs; unauthenticated floods then stop before the authorizer runs. None: no web ACL. Default: None.
      tenant_stacks: nested stacks the tenants' own resources (keys, usage plans, signing secrets, webhook queues,
        catalog entries) are spread over, each tenant's by a hash of its id (``cdk.tenant_stacks``); 0 keeps them in
        the stack itself, which holds about 21 tenants with one model. Changing it replaces the keys and secrets of
        the tenants it moves (docs/deploying.md, "Upgrading"). Default: 0.
      fleet_stacks: each model's fleet (queues, batch lane, GPU group, an ECS cluster of its own, worker service,
        scaling and capacity) in a nested stack of its own, every model alike, so that eight models fit beside the
        shared resources within CloudFormation's 500 resources per stack. False keeps every fleet in the stack itself,
        in the one cluster; changing it replaces every fleet. Default: False.
    Payloads
      retention_days: days before requests, uploads and results expire. Default: ``settings.PAYLOAD_RETENTION_DAYS``.
      cors_allowed_origins: browser origins allowed to PUT presigned uploads. Default: ``("*",)``.
    The inbox
      inbox_rules: objects written under ``inbox/<prefix>`` of the claim-check bucket become jobs (any object) or
        batches (``.jsonl``) of a tenant by rule (``async_inference.inbox.InboxRule``: prefix, tenant, model,
        endpoint, webhook_url), through an S3 notification per rule and the inbox function
        (``cdk.inbox.Inbox``). Default: none (no function, no notification).
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
      models: the models the stack serves (``ModelSpec``: name, kind ``chat`` or ``embedding``, source, instance
        type, task limits, the options below for that model), each with a fleet of its own
        (``cdk.model_fleet.ModelFleet``) in the stack's one VPC and cluster. The API routes each request by its
        ``model`` (``async_inference.fleets``); ``GET /v1/models`` lists them all. Each entry takes the options below
        where it leaves them unset; the first is ``model``. At most ``MAX_MODELS``. Default: none, one model:
        ``model`` with the options below.
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
        Amazon Linux 2023 AMI, which is x86_64 only; required with an arm64 ``gpu_instance_type`` (or ``gpu_ami_id``).
        Either parameter is read at each deploy: the AMI floats, and a deploy after AWS publishes a new one changes
        the launch template (docs/deploying.md, "The GPU instances' AMI").
      gpu_ami_id: the AMI of the GPU instances, pinned (``ami-...``, of the deploy's region): it changes only when this
        option does. Conflicts with ``gpu_ami_parameter_name``. Default: none (the AMI floats, as above).
      gpu_fallback_instance_types: other instance types of the same GPUs as ``gpu_instance_type`` (the same
        ``cdk.capacity.INSTANCE_GPUS`` entry: the task's GPU and ``max_num_seqs`` hold on each), tried in order when
        EC2 has no capacity of the first (the group's mixed instances policy, on-demand ``prioritized``), e.g.
        ``["g5.2xlarge", "g5.4xlarge"]`` for g5.xlarge. The fleets on ``gpu_instance_type`` take them; a model of
        another type does not. Conflicts with a warm pool (PutWarmPool refuses a group with a mixed instances policy,
        EC2 Auto Scaling API Reference): set ``gpu_warm_pool_instances`` to 0. Default: none (one type).
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
        fewer instances than ``max_worker_tasks``, its maximum at the pool's size, so that one more task waits for the
        pool's replacement instead of a fresh instance (``cdk.queue_scaling``). 0: no hold. Default: 420 (the pool's
        replacement initializes in about 7 minutes: boot, image pull, weights; docs/scaling.md).
    Monitoring
      oldest_message_alarm_seconds: alarm threshold on the age of the oldest queued job. Default: 900.
      alarm_topic_arn: an existing SNS topic the alarms notify. Default: none, a topic of the stack's own (output
        AlarmTopicArn).
      alarm_email: an address subscribed to the alarm topic. Default: none.
      log_retention: Default: one month.
    Lifecycle
      destroy_data_on_delete: ``cdk destroy`` deletes the table and the bucket's objects. Default: False (retain).
    """

    tenants: Mapping[str, TenantPlan] = field(default_factory=lambda: {"demo": TenantPlan()})
    api_stage_name: str = "prod"
    create_api_gateway_cloudwatch_role: bool = False
    waf_requests_per_5_min_per_ip: int | None = None
    tenant_stacks: int = 0
    fleet_stacks: bool = False
    request_limits: RequestLimits = RequestLimits()
    retention_days: int = settings.PAYLOAD_RETENTION_DAYS
    cors_allowed_origins: Sequence[str] = ("*",)
    subscriptions: Sequence[TopicSubscription] = ()
    inbox_rules: Sequence[InboxRule] = ()
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
    gpu_ami_id: str | None = None
    gpu_fallback_instance_types: tuple[str, ...] = ()
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
    alarm_email: str | None = None
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
        self._validate_fallback_instance_types()
        if self.gpu_ami_id is not None and self.gpu_ami_parameter_name is not None:
            raise ValueError(
                f"gpu_ami_id ({self.gpu_ami_id}) conflicts with gpu_ami_parameter_name "
                f"({self.gpu_ami_parameter_name}): pin the AMI with one, or let the parameter float it"
            )
        if self.gpu_ami_id is not None and not re.match(AMI_ID_PATTERN, self.gpu_ami_id):
            raise ValueError(f"gpu_ami_id ({self.gpu_ami_id}) is not an AMI id (ami- and 8 or 17 hex digits)")
        if is_arm64(self.gpu_instance_type) and not (self.gpu_ami_parameter_name or self.gpu_ami_id):
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
        validate_rules(self.inbox_rules, list(self.tenants), [spec.name for spec in self.model_specs()])

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
            gpu_fallback_instance_types=self.gpu_fallback_instance_types
            if given(spec.instance_type, self.gpu_instance_type) == self.gpu_instance_type
            else (),
        )

    def _validate_models(self) -> None:
        if not self.models:
            return
        if len(self.models) > MAX_MODELS:
            raise ValueError(f"models lists {len(self.models)} models; at most {MAX_MODELS} fit")
        if len(self.models) > MAX_MODELS_IN_STACK and not self.fleet_stacks:
            raise ValueError(
                f"models lists {len(self.models)} models; at most {MAX_MODELS_IN_STACK} fit one stack's 500 "
                f"resources: set fleet_stacks (each fleet in a nested stack of its own) for up to {MAX_MODELS}"
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

    def _validate_fallback_instance_types(self) -> None:
        fallbacks = self.gpu_fallback_instance_types
        if not fallbacks:
            return
        if isinstance(fallbacks, str) or self.gpu_instance_type in fallbacks or len(set(fallbacks)) != len(fallbacks):
            raise ValueError(
                f"gpu_fallback_instance_types ({fallbacks!r}) is a list of other types, each once, without "
                f"gpu_instance_type ({self.gpu_instance_type})"
            )
        gpus = capacity.INSTANCE_GPUS.get(self.gpu_instance_type)
        for other in fallbacks:
            if gpus is None or capacity.INSTANCE_GPUS.get(other) != gpus:
                raise ValueError(
                    f"gpu_fallback_instance_types names {other}, whose GPUs are not gpu_instance_type "
                    f"({self.gpu_instance_type})'s in cdk.capacity.INSTANCE_GPUS: a task sized for one GPU would "
                    "not fit the other (add the type's row there if it has the same GPUs)"
                )
        if self.effective_warm_pool_instances() > 0:
            raise ValueError(
                f"gpu_fallback_instance_types ({', '.join(fallbacks)}) conflicts with a warm pool of "
                f"{self.effective_warm_pool_instances()}: EC2 Auto Scaling puts no warm pool on a group with a mixed "
                "instances policy; set gpu_warm_pool_instances to 0"
            )

    def effective_warm_pool_instances(self) -> int:
        """``gpu_warm_pool_instances``, or ``DEFAULT_WARM_POOL_INSTANCES``, at most ``max_gpu_instances``."""
        pool = self.gpu_warm_pool_instances
        return min(DEFAULT_WARM_POOL_INSTANCES if pool is None else pool, self.max_gpu_instances)

    def wake_hold_maximum(self) -> int | None:
        """The most tasks a wake's hold allows: one per pooled instance, when the pool starts fewer than the most
        tasks (None: the hold raises the minimum only; without a pool one more task comes from a fresh instance
        whenever it is asked for)."""
        pool = self.effective_warm_pool_instances()
        return pool if 0 < pool < self.max_worker_tasks else None

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
