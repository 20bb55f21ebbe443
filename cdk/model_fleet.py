"""A model's own fleet: the models of the ``models`` context beyond the first, each with its claim-check queue pair,
its batch lane, its worker service (in the first model's VPC and cluster, on GPU instances of its own type) and its
scaling and capacity."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_ecs as ecs
from constructs import Construct

from async_inference import settings
from async_inference.fleets import CHAT, MODEL_KINDS
from cdk.gpu_capacity import GpuCapacity
from cdk.gpu_worker_service import WORKER_ECS_SERVICE_NAME, GpuWorkerService
from cdk.job_queue import JobQueue, secure_dead_letter_queue, secure_queue
from cdk.lambda_code import LambdaCode
from cdk.model_store import ModelStore
from cdk.queue_scaling import CountedQueue, QueueScaling

# Every function that queues work carries all the routes in one environment variable (async_inference.fleets), and
# Lambda allows 4 KB of variables a function: a route is about 480 bytes once its tokens resolve (two queue URLs and
# a service ARN), beside about 1.6 KB the API function's other variables take. More models would need the routes in
# an SSM parameter instead.
MAX_MODELS = 4
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


class ModelFleet(Construct):
    """A further model's fleet, built as the first model's is (cdk/service.py): ``jobs`` (queue and DLQ),
    ``lane_queue`` and ``lane_dead_letter_queue`` (its batch lane: chunks and jobs submitted with priority batch),
    ``workers`` (joining ``shared_with``'s VPC and cluster), ``scaling`` on both queues, ``capacity`` (its warm pool;
    the first fleet's release function releases the cluster's empty instances, this group's included).

    :param environment: the worker's environment, its queues, model and engine options included (the caller builds
        it as it builds the first model's).
    :param worker_options: ``GpuWorkerService``'s other options, as the first model's are given.
    :param scaling_options: ``QueueScaling``'s options but its service and queues.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        spec: ModelSpec,
        shared_with: GpuWorkerService,
        code: LambdaCode,
        worker_environment: Mapping[str, str],
        secrets: Mapping[str, ecs.Secret] | None,
        worker_options: Mapping[str, object],
        scaling_options: Mapping[str, object],
        warm_instances: int,
        models: ModelStore | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.spec = spec
        self.jobs = JobQueue(self, "Jobs")
        self.lane_dead_letter_queue = secure_dead_letter_queue(self, "LaneDeadLetterQueue")
        self.lane_queue = secure_queue(
            self,
            "LaneQueue",
            dead_letter_queue=self.lane_dead_letter_queue,
            max_receive_count=settings.MAX_RECEIVE_COUNT,
            visibility_timeout=Duration.seconds(settings.VISIBILITY_TIMEOUT_S),
            receive_message_wait_time=Duration.seconds(settings.RECEIVE_WAIT_TIME_S),
            retention_period=Duration.days(14),
        )
        self.workers = GpuWorkerService(
            self,
            "Workers",
            environment=worker_environment,
            secrets=secrets,
            shared_with=shared_with,
            ecs_service_name=spec.ecs_service_name,
            **worker_options,  # type: ignore[arg-type]
        )
        self.scaling = QueueScaling(
            self,
            "Scaling",
            service=self.workers.service,
            queues=[
                CountedQueue(self.jobs.queue),
                CountedQueue(self.lane_queue, weight=settings.BATCH_CHUNK_LINES),
            ],
            **scaling_options,  # type: ignore[arg-type]
        )
        self.capacity = GpuCapacity(
            self,
            "GpuCapacity",
            workers=self.workers,
            auto_scaling_group=self.workers.auto_scaling_group,
            cluster=self.workers.cluster,
            container=self.workers.container,
            code=code,
            warm_instances=warm_instances,
            release_empty=False,
            model=spec.name,  # its pool's instances fetch its weights before they are stopped
            models=models,
        )
