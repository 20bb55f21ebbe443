"""One model's fleet: its claim-check queue pair, its batch lane, its worker service (in the stack's VPC and cluster,
on GPU instances of its own type), its scaling and capacity, its worker's permissions and its route."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import jsii
from aws_cdk import Duration, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from async_inference import settings
from async_inference.config import (
    ENV_BATCH_QUEUE_URL,
    ENV_DLQ_URL,
    ENV_MODEL_KIND,
    ENV_PROGRESS_INTERVAL_S,
    ENV_QUEUE_URL,
    ENV_SERVED_MODELS,
    ENV_TOOL_CALL_PARSER,
    ENV_WEBHOOK_QUEUE_URLS,
)
from cdk.batches import Batches
from cdk.claim_check_bucket import ClaimCheckBucket
from cdk.gpu_capacity import GpuCapacity
from cdk.gpu_worker_service import WORKER_ECS_SERVICE_NAME, GpuWorkerService, group_arn
from cdk.job_queue import JobQueue, secure_dead_letter_queue, secure_queue
from cdk.job_streams import JobStreams
from cdk.job_table import JobTable
from cdk.lambda_code import LambdaCode
from cdk.model_store import ModelStore
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix
from cdk.options import AsyncInferenceServiceProps, ModelSpec
from cdk.queue_scaling import CountedQueue, QueueScaling
from cdk.result_topics import ResultTopics
from cdk.webhook_dispatch import WebhookDispatch
from cdk.websocket_push import WebSocketPush
from cdk.worker_cluster import FleetCluster, WorkerCluster

# The first model's resources were built in the service itself before every model had a fleet. Its fleet's id is
# "Default", which CDK leaves out of logical ids, and its lane lies in a scope named as the service's Batches construct
# where the lane was: so they keep the logical ids they were deployed with (tests/cdk/test_deployed_ids.py checks).
DEPLOYED_FIRST_FLEET_ID = "Default"
DEPLOYED_FIRST_LANE_SCOPE = "Batches"
# Above the priority (100) of the Name tag ec2.LaunchTemplate gives itself.
DEPLOYED_NAME_TAG_PRIORITY = 101


@dataclass(frozen=True)
class DeployedNames:
    """The names the ``index``-th model's fleet was deployed with (``deployed_names``): the fleet's construct id, its
    model store's (a child of the service) and its ECS service's, and the ids of its alarms in ``cdk.monitoring``:
    the suffix of its oldest-job alarm and the names of its two dead-letter queues' alarms."""

    fleet_id: str
    store_id: str
    ecs_service_name: str
    alarm_key: str
    job_dead_letters: str
    lane_dead_letters: str


def deployed_names(index: int, spec: ModelSpec, *, nested: bool = False) -> DeployedNames:
    """``DEPLOYED_FIRST_FLEET_ID``, ``Models``, ``WORKER_ECS_SERVICE_NAME`` and unsuffixed alarms for the first model;
    ``construct_id``, ``Models<construct_id>``, ``ecs_service_name`` of its spec and alarms suffixed with its
    construct id for the others, and for every model when the fleets are ``nested`` (``fleet_stacks``: none was
    deployed there before)."""
    if index == 0 and not nested:
        return DeployedNames(
            DEPLOYED_FIRST_FLEET_ID,
            "Models",
            WORKER_ECS_SERVICE_NAME,
            alarm_key="",
            job_dead_letters="JobDeadLetterQueue",
            lane_dead_letters="BatchLaneDeadLetterQueue",
        )
    key = spec.construct_id
    return DeployedNames(
        key,
        f"Models{key}",
        spec.ecs_service_name,
        alarm_key=key,
        job_dead_letters=f"JobDeadLetterQueue{key}",
        lane_dead_letters=f"LaneDeadLetterQueue{key}",
    )


@dataclass(frozen=True, kw_only=True)
class SharedResources:
    """What every fleet's worker uses of the service: the cluster it joins, the Lambda code of its capacity functions,
    the worker environment the service gives every model (runtime configuration, webhook queue, batch table and
    control queue, progress and push settings), and the resources its worker is granted on."""

    cluster: WorkerCluster | FleetCluster
    code: LambdaCode
    worker_environment: Mapping[str, str]
    bucket: ClaimCheckBucket
    table: JobTable
    results: ResultTopics
    webhooks: WebhookDispatch
    batches: Batches
    push: WebSocketPush | None
    streams: JobStreams


class ModelFleet(Construct):
    """One model's fleet: ``jobs`` (its job queue and DLQ), ``lane_queue`` and ``lane_dead_letter_queue`` (its batch
    lane: chunks, and jobs submitted with priority batch), ``workers`` (its GPU instances, task definition and service
    in ``shared.cluster``), ``scaling`` on both queues, ``capacity`` (its warm pool, and, unless ``release_with`` is
    given, the function that releases the cluster's empty instances, every fleet's group included).

    The worker container gets the service's shared environment with its own model, engine options and queues, and
    exactly the calls its code makes (``grant_worker``). ``route`` is the fleet's entry of MODEL_FLEETS
    (``async_inference.fleets``), by which every function that queues work finds its queues.

    :param spec: the model.
    :param ecs_service_name: its ECS service's name, unique in the cluster (``deployed_names``).
    :param props: the service's options as this model's fleet reads them (``AsyncInferenceServiceProps.for_model``).
    :param shared: the service's resources the fleet uses.
    :param models: the model's S3 store (``model_source`` ``"s3"``). Default: none.
    :param release_with: the release function of another fleet in the same cluster, which releases this fleet's empty
        instances too (it reads the groups from the cluster's capacity providers). Default: none, this fleet's
        capacity has the release function (with ``release_empty_gpu_instances``).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        spec: ModelSpec,
        ecs_service_name: str,
        props: AsyncInferenceServiceProps,
        shared: SharedResources,
        models: ModelStore | None = None,
        release_with: lambda_.Function | None = None,
    ) -> None:
        super().__init__(scope, id)
        self.spec, self.props, self.shared, self.models = spec, props, shared, models
        self.jobs = JobQueue(self, "Jobs")
        lanes = Construct(self, DEPLOYED_FIRST_LANE_SCOPE) if id == DEPLOYED_FIRST_FLEET_ID else self
        self.lane_dead_letter_queue = secure_dead_letter_queue(lanes, "LaneDeadLetterQueue")
        self.lane_queue = secure_queue(
            lanes,
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
            image_context=props.worker_image_context,
            dockerfile=props.worker_dockerfile,
            environment=self._worker_environment(),
            secrets=self._secrets(),
            instance_type=props.gpu_instance_type,
            machine_image=machine_image(props),
            fallback_instance_types=props.gpu_fallback_instance_types,
            max_instances=props.max_gpu_instances,
            start_before_stop=props.deployment_spare_instances > 0,
            instance_warmup=Duration.seconds(props.gpu_instance_warmup_seconds),
            task_protection=props.worker_task_protection,
            task_protection_tokens_per_s=props.worker_task_protection_tokens_per_s,
            memory_reservation_mib=props.worker_memory_reservation_mib,
            cluster=shared.cluster,
            log_retention=props.log_retention,
            ecs_service_name=ecs_service_name,
        )
        self.scaling = QueueScaling(
            self,
            "Scaling",
            service=self.workers.service,
            # A batch-lane message is a chunk of BATCH_CHUNK_LINES lines (or one job submitted with priority batch:
            # counting it as a full chunk over-provisions by at most one task's share while such jobs wait).
            queues=[
                CountedQueue(self.jobs.queue),
                CountedQueue(self.lane_queue, weight=settings.BATCH_CHUNK_LINES),
            ],
            jobs_per_task=props.effective_jobs_per_task(),
            max_tasks=props.max_worker_tasks,
            scale_out_cooldown=Duration.seconds(props.scale_out_cooldown_seconds),
            scale_in_fill=props.scale_in_fill,
            scale_in_minutes=props.scale_in_minutes,
            scale_in_cooldown=Duration.seconds(props.scale_in_cooldown_seconds),
            keep_alive_minutes=props.idle_minutes_before_scale_in,
            wake_check_interval=Duration.seconds(props.wake_check_interval_seconds),
            wake_hold=Duration.seconds(props.wake_hold_seconds),
            # With a warm pool of fewer instances than the most tasks, a wake's hold also keeps the maximum at the
            # tasks the pool can start, until the pool's replacement is ready.
            wake_hold_maximum=props.wake_hold_maximum(),
        )
        self.capacity = GpuCapacity(
            self,
            "GpuCapacity",
            workers=self.workers,
            auto_scaling_group=self.workers.auto_scaling_group,
            cluster=self.workers.cluster,
            container=self.workers.container,
            code=shared.code,
            warm_instances=props.effective_warm_pool_instances(),
            release_empty=props.release_empty_gpu_instances and release_with is None,
            model=spec.name,  # the pool's instances fetch its weights before they are stopped
            models=models,
        )
        if release_with is not None:
            self._grant_release(release_with)
        self.grant_worker()
        if id == DEPLOYED_FIRST_FLEET_ID:
            self._keep_deployed_instance_name()

    def route(self, *, wake: bool) -> dict[str, str | int]:
        """The fleet's route (``async_inference.fleets.FleetRoute``), with the stack's tokens; with ``wake``, what a
        wake from zero needs: its service, the hold's bounds when the hold keeps a maximum (the maximum while it
        lasts, and the one its end restores), and the GPU group an instance starts in."""
        route: dict[str, str | int] = {
            "kind": self.spec.kind,
            "queue_url": self.jobs.queue.queue_url,
            "batch_queue_url": self.lane_queue.queue_url,
        }
        if wake:
            target = self.scaling.wake_target
            route["worker_service"] = target.service
            if target.hold_max_tasks is not None:
                route["worker_hold_max_tasks"] = target.hold_max_tasks
                route["worker_max_tasks"] = target.max_tasks  # type: ignore[assignment]  # set with the hold maximum
            route["worker_group"] = self.capacity.auto_scaling_group.auto_scaling_group_name
            if isinstance(self.shared.cluster, FleetCluster):  # its own cluster, not the stack's
                route["worker_cluster"] = self.workers.cluster.cluster_name
        return route

    def grant_send_jobs(self, function: lambda_.Function) -> None:
        """Let ``function`` queue jobs on this model: its job queue, and its batch lane (priority batch)."""
        self.jobs.queue.grant(function, "sqs:SendMessage")
        self.lane_queue.grant(function, "sqs:SendMessage")

    def grant_wake(self, function: lambda_.Function) -> None:
        """Let ``function`` wake this fleet from zero: its service, and an instance of its GPU group at once instead
        of after managed scaling's next minute (both named in the fleet's ``route``)."""
        self.scaling.grant_wake(function)
        self.capacity.grant_instance_start(function)

    def grant_worker(self) -> None:
        """The worker's permissions: its job queue and batch lane, its model, and the shared resources."""
        shared = self.shared
        bucket, table, results = shared.bucket, shared.table, shared.results
        requests, uploads, result_objects = settings.REQUEST_PREFIX, settings.UPLOAD_PREFIX, settings.RESULT_PREFIX
        # Receive, extend and delete claim checks, and send back to the tail those of a tenant at its share
        # (gpu_worker.fairness); read payloads; write results (reading one back when an earlier run wrote it first);
        # check cancellations in batches; notify; queue "started" events.
        worker = self.workers.task_definition.task_role
        consume = ("sqs:ReceiveMessage", "sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:SendMessage")
        self.jobs.queue.grant(worker, *consume)
        bucket.grant_get(worker, requests, uploads, result_objects)
        bucket.grant_put(worker, result_objects)
        table.grant_items(worker, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem")
        results.grant_publish(worker)
        shared.webhooks.grant_send(worker)
        shared.streams.grant_append(worker)  # streamed jobs' text, as it decodes
        if shared.push is not None:
            shared.push.grant_publish_events(worker)  # job.started, job.progress
        if self.models is not None:
            self.models.grant_read(worker)  # the model's prefix, nothing else of its bucket

        # The batch lane (docs/design/batches.md): receive, extend and delete chunk claim checks, and send back to the
        # tail those its fair scout steps over (gpu_worker.fairness); ranged reads of input files; write parts; the
        # batches' statuses (BatchGetItem) and chunk counts (UpdateItem, GetItem when already counted); finalize steps.
        batches = shared.batches
        self.lane_queue.grant(worker, *consume)
        bucket.grant_get(worker, settings.FILE_PREFIX)
        bucket.grant_put(worker, settings.BATCH_PREFIX)
        batches.grant_items(worker, "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:BatchGetItem")
        batches.control_queue.grant(worker, "sqs:SendMessage")

    def _worker_environment(self) -> dict[str, str]:
        """The worker container's variables: the shared ones, with this model, its engine options and its queues."""
        props = self.props
        parser = props.effective_tool_call_parser()
        return {
            **self.shared.worker_environment,
            ENV_QUEUE_URL: self.jobs.queue.queue_url,
            ENV_DLQ_URL: self.jobs.dead_letter_queue.queue_url,
            "ENGINE": "vllm",
            "MODEL": props.model,
            ENV_MODEL_KIND: self.spec.kind,
            ENV_SERVED_MODELS: json.dumps([props.model]),  # its own model only: a batch line for another is a 404
            **({ENV_TOOL_CALL_PARSER: parser} if parser else {}),
            **(dict(self.models.environment) if self.models is not None else {}),
            "MAX_NUM_SEQS": str(props.effective_max_num_seqs()),
            ENV_WEBHOOK_QUEUE_URLS: self.shared.webhooks.queue_urls_json,  # "started" events, to each tenant's queue
            **self.shared.batches.environment,  # the batch table, its counters and finalize steps
            ENV_BATCH_QUEUE_URL: self.lane_queue.queue_url,
            ENV_PROGRESS_INTERVAL_S: str(props.progress_interval_s),
            **(self.shared.push.worker_environment if self.shared.push else {}),  # started and progress events
            **self.shared.streams.environment,  # streamed jobs' text, as it decodes
        }

    def _secrets(self) -> dict[str, ecs.Secret]:
        """HF_TOKEN from ``hf_token_secret_arn`` (gated models from the Hub), or none."""
        if self.props.model_source == "s3" or not self.props.hf_token_secret_arn:
            return {}
        token = secretsmanager.Secret.from_secret_complete_arn(self, "HuggingFaceToken", self.props.hf_token_secret_arn)
        return {"HF_TOKEN": ecs.Secret.from_secrets_manager(token)}  # type: ignore[arg-type]

    def _keep_deployed_instance_name(self) -> None:
        """The launch template names its instances and volumes by its construct path (their Name tag), which for
        the first fleet holds ``DEPLOYED_FIRST_FLEET_ID``: they keep the name they were deployed with, the path
        without it."""
        template = self.workers.node.find_child("LaunchTemplate")
        deployed = template.node.path.replace(f"/{DEPLOYED_FIRST_FLEET_ID}/", "/")
        Tags.of(template).add("Name", deployed, priority=DEPLOYED_NAME_TAG_PRIORITY)

    def _grant_release(self, function: lambda_.Function) -> None:
        """``function``, another fleet's release function in this cluster, releases this fleet's empty instances: the
        same calls on this group as on its own (cdk.gpu_capacity.GpuCapacity)."""
        stack = Stack.of(self)
        group = self.workers.auto_scaling_group
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["autoscaling:SetInstanceProtection", "autoscaling:SetDesiredCapacity"],
                resources=[group_arn(group)],
            )
        )
        acknowledge(
            function,
            {
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{rendered_account(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/<{stack.get_logical_id(group.node.default_child)}>]": "An "
                "Auto Scaling group's ARN holds a generated id; the statement names another model's GPU group by name.",
            },
        )


@jsii.implements(ec2.IMachineImage)
class PinnedImage:
    """One AMI by id, as the launch template's literal ImageId (``ec2.MachineImage.generic_linux`` needs the region
    at synth, which an environment-agnostic stack does not have)."""

    def __init__(self, ami_id: str) -> None:
        self.ami_id = ami_id

    def get_image(self, scope: Construct) -> ec2.MachineImageConfig:
        return ec2.MachineImageConfig(
            image_id=self.ami_id, os_type=ec2.OperatingSystemType.LINUX, user_data=ec2.UserData.for_linux()
        )


def machine_image(props: AsyncInferenceServiceProps) -> ec2.IMachineImage | None:
    """The GPU instances' AMI: pinned (``gpu_ami_id``), read from a parameter at each deploy
    (``gpu_ami_parameter_name``), or None: ECS's GPU-optimized AMI, read from its public parameter at each deploy."""
    if props.gpu_ami_id:
        return PinnedImage(props.gpu_ami_id)
    if props.gpu_ami_parameter_name:
        return ec2.MachineImage.from_ssm_parameter(props.gpu_ami_parameter_name)
    return None
