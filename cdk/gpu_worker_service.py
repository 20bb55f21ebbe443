"""GPU workers: an Auto Scaling group of GPU instances in a shared ECS cluster, and the vLLM worker service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import ArnFormat, Aspects, Duration, IAspect, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from async_inference.config import (
    DEFAULT_TASK_PROTECTION,
    DEFAULT_TASK_PROTECTION_TOKENS_PER_S,
    ENV_TASK_PROTECTION,
    ENV_TASK_PROTECTION_TOKENS_PER_S,
    TASK_PROTECTION_MODES,
)
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix
from cdk.worker_cluster import FleetCluster, WorkerCluster
from cdk.worker_image import context_patterns

# EC2 caps a container's stop timeout at 120 s: the time the worker gets after SIGTERM to finish or release its jobs.
STOP_TIMEOUT = Duration.seconds(120)
MODEL_CACHE_HOST_PATH = "/var/lib/async-inference/models"
MODELS_CONTAINER_PATH = "/models"  # where the host directory appears in the container (the image's HF_HOME is under it)
# The worker's Powertools service name: the ``service`` dimension of the metrics it emits (the dashboard plots by it).
WORKER_SERVICE_NAME = "async-inference-worker"
# The ECS service's name, fixed at synth (names are unique per cluster, and the cluster is the stack's own): the
# functions that wake the workers find the service by it (and by the cluster's name), so they never refer to the
# service resource, and CloudFormation creates the API without waiting for the service, which on create waits for a
# GPU instance to launch, pull the image and turn healthy. The cost: a change that replaces the service (its launch
# type, its cluster) needs another name first, as CloudFormation replaces no custom-named resource.
WORKER_ECS_SERVICE_NAME = "gpu-workers"
# Only what the worker image needs (the build context is the repository root): the patterns of the ignore file beside
# its Dockerfile, which BuildKit reads when it builds the staged asset, so the asset stages what the build will send.
WORKER_IMAGE_EXCLUDE = context_patterns()
# The container health check. The contract (async_inference.config): the worker touches WORKER_HEALTH_FILE while its
# loops run, and `python3 -m gpu_worker.health` exits non-zero once that file is older than HEALTH_MAX_AGE_S.
HEALTH_CHECK_COMMAND = ["CMD", "python3", "-m", "gpu_worker.health"]
# The loops start only after the model is downloaded (or synced from S3) and loaded, which takes minutes. ECS caps the
# start period at 300 s, so the retries carry the rest: a task is marked unhealthy only after 300 s + 10 x 60 s =
# 15 minutes without one passing check. Replacing a slow starter would loop forever (and trip the deployment circuit
# breaker); a hung worker costs less, since its jobs return to the queue when its heartbeat stops, so the check only
# has to reclaim the GPU, within HEALTH_MAX_AGE_S + 10 minutes.
HEALTH_CHECK_START_PERIOD = Duration.seconds(300)
HEALTH_CHECK_INTERVAL = Duration.seconds(60)
HEALTH_CHECK_RETRIES = 10  # ECS's maximum
# One Python start and a stat(); generous because vLLM may keep every CPU busy while it loads.
HEALTH_CHECK_TIMEOUT = Duration.seconds(10)
# What the capacity provider's instance warm-up guards is the new instance registering with the cluster: its boot,
# about 2 minutes for a GPU instance (bench/scaling/figures.py INSTANCE_BOOT_S). ECS's 300 s default would keep a
# second instance from launching for 5 minutes after the first.
INSTANCE_WARMUP = Duration.seconds(120)

# The SSM Agent's calls for Session Manager sessions on the GPU instances (the least-privilege instance policy the
# Systems Manager User Guide gives for Session Manager, without S3 or KMS session logging).
SESSION_MANAGER_ACTIONS = (
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)


def group_arn(group: autoscaling.AutoScalingGroup) -> str:
    """The group's ARN by its name (its id part is generated, so a wildcard stands for it)."""
    return Stack.of(group).format_arn(
        service="autoscaling",
        resource="autoScalingGroup",
        resource_name=f"*:autoScalingGroupName/{group.auto_scaling_group_name}",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class GpuWorkerService(Construct):
    """The vLLM worker as an ECS service on GPU instances that ECS scales with the tasks it has to place.

    Instances live in the worker subnets of ``cluster`` (:class:`cdk.worker_cluster.WorkerCluster`): private ones,
    or public ones where each instance gets a public IPv4 address and a security group that admits nothing inbound.

    The Auto Scaling group is an ``AsgCapacityProvider`` with managed scaling (instances follow the tasks to place,
    down to zero) and managed termination protection (ECS never terminates an instance that runs a task). The
    service's task count is scaled by :class:`cdk.queue_scaling.QueueScaling`.

    Task count: ``cdk.fleet_lifecycle.FleetLifecycle`` (made by ``cdk.gpu_capacity.GpuCapacity``) gives the service's
    ``DesiredCount``: 0 on create, so CloudFormation waits for no GPU task (a GPU quota of 0, no capacity in the zones,
    a driver, image or model fault cannot roll back the API, queues and tables; the first job's wake starts the first
    task), and the service's own count on later deploys. A literal 0 would not do: CloudFormation re-applies a
    template's DesiredCount on every service update, resetting a busy fleet whenever new worker code is deployed; no
    DesiredCount at all makes CloudFormation create the service at 1 and wait for that task.

    Deployments, at full load included (every GPU busy, every task protected):

    * ``start_before_stop=False`` (stop-before-start: minimum healthy 0%, maximum 100%): ECS stops an old task before
      it starts its replacement, in the GPU the old task frees, so a deployment never needs a GPU the fleet does not
      have. ECS does not stop a task with scale-in protection, which the worker holds as ``task_protection`` says
      (by default while it runs a job longer than its drain): a protected task is replaced once its protection
      clears or lapses (``gpu_worker.task_protection.EXPIRES_IN_MINUTES``), and then drains in its stop timeout.
      Capacity dips by one task while its replacement loads the model.
    * ``start_before_stop=True`` (minimum healthy 100%, maximum 200%): a new task starts before an old one stops,
      which needs a GPU beyond the running tasks; :class:`cdk.options.AsyncInferenceServiceProps` only allows it with
      spare instances under ``max_instances``. New tasks beyond the spare GPUs wait (PROVISIONING) until an old task
      stops; old tasks stop, as above, when idle or unprotected. No capacity dip, for the cost of the spare instance
      while a deployment runs.

    :param image_context: Docker build context of the worker image. Default: the repository root.
    :param dockerfile: Dockerfile path inside ``image_context``. Default: ``gpu_worker/Dockerfile``.
    :param environment: the service's runtime configuration, plus ENGINE, MODEL and MAX_NUM_SEQS. The construct adds
        AWS_REGION and AWS_DEFAULT_REGION (the stack's region) and POWERTOOLS_SERVICE_NAME (``service_name``).
    :param secrets: container secrets by variable name (e.g. HF_TOKEN from Secrets Manager); the execution role
        gets read access to each. Default: none.
    :param service_name: Powertools service name, the ``service`` dimension of the worker's metrics. Default:
        ``WORKER_SERVICE_NAME``.
    :param instance_type: GPU instance type. Default: ``g5.xlarge`` (1 A10G, 24 GiB GPU memory, 16 GiB RAM). Its
        architecture is the worker image's platform: arm64 for Graviton GPU types (g5g), amd64 for the rest, whatever
        machine builds the image.
    :param machine_image: AMI of the GPU instances. Default: ECS's GPU-optimized Amazon Linux 2023 AMI, which exists
        for x86_64 only; required for an arm64 ``instance_type`` (an AMI with the NVIDIA driver, the NVIDIA container
        toolkit and the ECS agent with GPU support).
    :param fallback_instance_types: other types of the same GPUs, launched in this order when EC2 has no capacity
        of ``instance_type`` (a mixed instances policy, on-demand ``prioritized``). Default: none (one type).
    :param max_instances: most GPU instances at once. Default: 2.
    :param start_before_stop: deployments start new tasks before stopping old ones (needs spare GPUs, see above).
        Default: False (stop-before-start).
    :param instance_warmup: the capacity provider's instance warm-up: how long after launching an instance managed
        scaling waits before it launches more. Default: 120 s (a GPU instance's boot).
    :param task_protection: when the worker holds ECS task scale-in protection (the task definition's
        TASK_PROTECTION): ``"long_jobs"`` while it runs a job expected to outlast its SIGTERM drain, so that a
        step-down may stop a busy task whose jobs finish or hand back within the drain; ``"busy"`` whenever it holds
        a job; ``"off"`` never (and the task role gets no protection permission). Default: ``"long_jobs"``.
    :param task_protection_tokens_per_s: the decode rate per sequence ``"long_jobs"`` expects, so that a job's
        expected run is its max_tokens at this rate (TASK_PROTECTION_TOKENS_PER_S). Default: 20.
    :param memory_reservation_mib: memory reserved for the worker container. Default: 12288 (fits a g5.xlarge).
    :param root_volume_gib: instance root volume (image layers, model weights). Default: 100.
    :param cluster: the VPC and ECS cluster this service joins, with its own GPU instances, capacity provider, task
        definition and service in them (every model's fleet, ``cdk.model_fleet.ModelFleet``).
    :param log_retention: worker log retention. Default: one month.
    :param ecs_service_name: the ECS service's name, unique in the cluster. Default: ``WORKER_ECS_SERVICE_NAME``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        image_context: Path,
        dockerfile: str = "gpu_worker/Dockerfile",
        environment: Mapping[str, str],
        secrets: Mapping[str, ecs.Secret] | None = None,
        service_name: str = WORKER_SERVICE_NAME,
        instance_type: str = "g5.xlarge",
        machine_image: ec2.IMachineImage | None = None,
        fallback_instance_types: Sequence[str] = (),
        max_instances: int = 2,
        start_before_stop: bool = False,
        instance_warmup: Duration = INSTANCE_WARMUP,
        task_protection: str = DEFAULT_TASK_PROTECTION,
        task_protection_tokens_per_s: float = DEFAULT_TASK_PROTECTION_TOKENS_PER_S,
        memory_reservation_mib: int = 12288,
        root_volume_gib: int = 100,
        cluster: WorkerCluster | FleetCluster,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        ecs_service_name: str = WORKER_ECS_SERVICE_NAME,
    ) -> None:
        super().__init__(scope, id)
        self.ecs_service_name = ecs_service_name
        if task_protection not in TASK_PROTECTION_MODES:
            raise ValueError(f"task_protection ({task_protection!r}) must be one of {', '.join(TASK_PROTECTION_MODES)}")
        if task_protection_tokens_per_s <= 0:
            raise ValueError(f"task_protection_tokens_per_s ({task_protection_tokens_per_s:g}) must be positive")
        self.task_protection = task_protection
        self.task_protection_tokens_per_s = task_protection_tokens_per_s
        self.service_name = service_name
        self.image_platform = image_platform(instance_type)
        if machine_image is None and is_arm64(instance_type):
            raise ValueError(
                f"instance_type {instance_type} is arm64 and ECS publishes its GPU-optimized AMI for x86_64 only: "
                "give machine_image"
            )
        self.public_subnets, self.vpc, self.cluster = cluster.public_subnets, cluster.vpc, cluster.cluster
        self.auto_scaling_group = self._gpu_instances(
            instance_type,
            machine_image or ecs.EcsOptimizedImage.amazon_linux2023(ecs.AmiHardwareType.GPU),
            max_instances,
            root_volume_gib,
            fallback_instance_types,
        )
        self.capacity_provider = ecs.AsgCapacityProvider(
            self,
            "GpuCapacity",
            auto_scaling_group=self.auto_scaling_group,
            enable_managed_scaling=True,
            enable_managed_termination_protection=True,
            enable_managed_draining=True,
            target_capacity_percent=100,
            instance_warmup_period=int(instance_warmup.to_seconds()),
        )
        self.cluster.add_asg_capacity_provider(self.capacity_provider)
        acknowledge(
            self.instance_role,
            {
                "AwsSolutions-IAM5[Action::ecs:Submit*]": "Written by ecs.Cluster for the container agent (state "
                "change submissions), scoped to this cluster.",
                "AwsSolutions-IAM5[Resource::*]": "Written by ecs.Cluster for the container agent: ecs:Poll and "
                "StartTelemetrySession carry a condition on this cluster; ecr:GetAuthorizationToken, "
                "ecs:DiscoverPollEndpoint and the agent's log calls support no narrower resource; nor do the SSM "
                "Agent's Session Manager calls (ssm:UpdateInstanceInformation, ssmmessages:*Channel).",
            },
        )
        self.task_definition = ecs.Ec2TaskDefinition(self, "TaskDefinition")
        self.container = self.task_definition.add_container(
            "Worker",
            image=ecs.ContainerImage.from_asset(
                str(image_context), file=dockerfile, exclude=WORKER_IMAGE_EXCLUDE, platform=self.image_platform
            ),
            gpu_count=1,
            memory_reservation_mib=memory_reservation_mib,
            environment=self._container_environment(environment),
            secrets=dict(secrets) if secrets else None,
            stop_timeout=STOP_TIMEOUT,
            health_check=ecs.HealthCheck(
                command=HEALTH_CHECK_COMMAND,
                start_period=HEALTH_CHECK_START_PERIOD,
                interval=HEALTH_CHECK_INTERVAL,
                retries=HEALTH_CHECK_RETRIES,
                timeout=HEALTH_CHECK_TIMEOUT,
            ),
            # vLLM's workers exchange tensors through /dev/shm; Docker's 64 MiB default is too small.
            linux_parameters=ecs.LinuxParameters(
                self, "LinuxParameters", shared_memory_size=2048, init_process_enabled=True
            ),
            logging=ecs.LogDrivers.aws_logs(
                stream_prefix="worker",
                log_group=logs.LogGroup(
                    self, "WorkerLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
                ),
            ),
        )
        # The image sets HF_HOME under /models; a host directory there keeps downloaded weights across task restarts
        # on the same instance, so a scale-out onto a warm instance skips the download.
        self.task_definition.add_volume(name="models", host=ecs.Host(source_path=MODEL_CACHE_HOST_PATH))
        self.container.add_mount_points(
            ecs.MountPoint(container_path=MODELS_CONTAINER_PATH, source_volume="models", read_only=False)
        )
        acknowledge(
            self.task_definition,
            {
                "AwsSolutions-ECS2": "The environment holds resource names, the model id and tuning values; no "
                "secrets (a Hugging Face token is a container secret from Secrets Manager).",
                "AwsSolutions-IAM5[Resource::*]": "Execution role: ecr:GetAuthorizationToken supports no "
                "resource-level permissions (the image pull is granted on the one asset repository).",
            },
        )
        self.service = ecs.Ec2Service(
            self,
            "Service",
            cluster=self.cluster,
            service_name=ecs_service_name,
            task_definition=self.task_definition,
            capacity_provider_strategies=[
                ecs.CapacityProviderStrategy(capacity_provider=self.capacity_provider.capacity_provider_name, weight=1)
            ],
            circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
            # No desired_count: FleetLifecycle sets DesiredCount from its custom resource (class docstring). The flag
            # @aws-cdk/aws-ecs-patterns:removeDefaultDesiredCount only concerns the ecs_patterns constructs.
            min_healthy_percent=100 if start_before_stop else 0,
            max_healthy_percent=200 if start_before_stop else 100,
            # Rebalancing moves tasks between zones by starting new ones and stopping old: a model load each, and a
            # GPU the fleet may not have. Tasks go where GPU capacity is.
            availability_zone_rebalancing=ecs.AvailabilityZoneRebalancing.DISABLED,
        )
        # CreateService with a capacity provider strategy fails ("capacity provider not associated with the cluster")
        # when it runs before the cluster's AWS::ECS::ClusterCapacityProviderAssociations, and nothing in the
        # properties orders the two (aws/containers-roadmap#631): the service depends on it explicitly.
        Aspects.of(self.service).add(_AfterCapacityProviderAssociation(self.cluster))
        if task_protection != "off":
            self._allow_task_protection()

    def _container_environment(self, environment: Mapping[str, str]) -> dict[str, str]:
        region = Stack.of(self).region  # a literal, or {"Ref": "AWS::Region"} for an environment-agnostic stack
        return {
            **environment,
            # boto3 needs a region and reads no instance metadata for it; the ECS agent sets none for EC2 tasks that
            # the worker could rely on, so the task definition says it.
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
            "POWERTOOLS_SERVICE_NAME": self.service_name,
            # The worker reads these; the scaling simulator (bench/scaling/template.py) reads them from here too.
            ENV_TASK_PROTECTION: self.task_protection,
            ENV_TASK_PROTECTION_TOKENS_PER_S: f"{self.task_protection_tokens_per_s:g}",
        }

    def _gpu_instances(
        self,
        instance_type: str,
        machine_image: ec2.IMachineImage,
        max_instances: int,
        root_volume_gib: int,
        fallback_instance_types: Sequence[str],
    ) -> autoscaling.AutoScalingGroup:
        security_group = ec2.SecurityGroup(
            self, "InstanceSecurityGroup", vpc=self.vpc, description="GPU workers: outbound only"
        )
        role = iam.Role(self, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
        self.instance_role = role
        # Session Manager (`aws ssm start-session --target <instance id>`): a shell on a GPU instance with no inbound
        # port and no SSH key. These are the calls the SSM Agent makes for sessions ("Step 2: Verify or add instance
        # permissions for Session Manager", Systems Manager User Guide), not AmazonSSMManagedInstanceCore's whole set
        # (its ssm:Get*/List*, documents, parameters). None of them takes a narrower resource than "*".
        role.add_to_policy(iam.PolicyStatement(actions=list(SESSION_MANAGER_ACTIONS), resources=["*"]))
        launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(instance_type),
            machine_image=machine_image,
            # The cluster appends its join commands to this user data (a launch template must expose one).
            user_data=ec2.UserData.for_linux(),
            role=role,
            security_group=security_group,
            # Public subnets: the instance reaches ECR, SQS, SNS and the Hub through the internet gateway with its
            # own address; its security group admits nothing inbound.
            associate_public_ip_address=True if self.public_subnets else None,
            require_imdsv2=True,
            # 1: IMDS answers the instance (its ECS agent) only. Containers in bridge mode are one hop farther, so
            # they cannot take the instance role; the worker needs no instance metadata (its credentials come from
            # the task role through the ECS agent, its region from the task definition).
            http_put_response_hop_limit=1,
            detailed_monitoring=True,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/xvda",
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_gib, volume_type=ec2.EbsDeviceVolumeType.GP3, encrypted=True
                    ),
                )
            ],
        )
        group = autoscaling.AutoScalingGroup(
            self,
            "GpuInstances",
            vpc=self.vpc,
            vpc_subnets=ec2.SubnetSelection(
                subnet_type=ec2.SubnetType.PUBLIC if self.public_subnets else ec2.SubnetType.PRIVATE_WITH_EGRESS
            ),
            **_launch(launch_template, [instance_type, *fallback_instance_types]),
            min_capacity=0,
            max_capacity=max_instances,
        )
        if fallback_instance_types:
            acknowledge(
                group,
                {
                    # The rule reads block devices from a group's own launch template, not through a mixed instances
                    # policy's, and throws; the one template's root volume is encrypted above.
                    "AwsSolutions::AwsSolutions-EC26": "The launch template's only volume (its root, gp3) is encrypted; "
                    "the group reaches the template through its mixed instances policy, which the rule cannot read."
                },
            )
        acknowledge(
            group,
            {
                "AwsSolutions-AS3": "ECS managed scaling drives this group; scaling activity shows in the ECS service "
                "events and the dashboard, so per-group SNS notifications would only duplicate them."
            },
        )
        return group

    def _allow_task_protection(self) -> None:
        # Task scale-in protection is requested by the worker through $ECS_AGENT_URI with the task role; only tasks
        # of this cluster can be protected.
        stack = Stack.of(self)
        acknowledge(
            self.task_definition.task_role,
            {
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'ecs')}:{rendered_account(stack)}:task/"
                f"<{stack.get_logical_id(self.cluster.node.default_child)}>/*]": "Task ids are assigned at launch; "
                "the statement admits only tasks of this cluster, and only the two task protection actions.",
            },
        )
        self.task_definition.task_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ecs:UpdateTaskProtection", "ecs:GetTaskProtection"],
                resources=[
                    stack.format_arn(service="ecs", resource="task", resource_name=f"{self.cluster.cluster_name}/*")
                ],
            )
        )
        # The worker asks whether a newer deployment of its own service waits (gpu_worker.deployments), so that it
        # stops holding protection and a deploy can finish: DescribeServices on this one service only.
        self.task_definition.task_role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["ecs:DescribeServices"],
                resources=[
                    stack.format_arn(
                        service="ecs",
                        resource="service",
                        resource_name=f"{self.cluster.cluster_name}/{self.ecs_service_name}",
                    )
                ],
            )
        )


@jsii.implements(IAspect)
class _AfterCapacityProviderAssociation:
    """Makes the service it visits depend on the cluster's capacity provider association, which ``ecs.Cluster``
    creates only at synthesis (an aspect of its own, as a child with the cluster's id), so it cannot be named when the
    service is built."""

    def __init__(self, cluster: ecs.Cluster) -> None:
        self.cluster = cluster

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, ecs.CfnService):
            return
        association = self.cluster.node.try_find_child(self.cluster.node.id)
        if not isinstance(association, ecs.CfnClusterCapacityProviderAssociations):
            raise ValueError(
                f"{self.cluster.node.path} has no capacity provider association for the service to wait "
                "for: add the capacity provider to the cluster"
            )
        node.node.add_dependency(association)


def _launch(launch_template: ec2.LaunchTemplate, instance_types: Sequence[str]) -> dict[str, Any]:
    """The group's launch: the template alone for one type; for several, a mixed instances policy that launches the
    first type EC2 has capacity for, in order (on-demand only: a Spot interruption would end a job mid-answer)."""
    if len(instance_types) == 1:
        return {"launch_template": launch_template}
    policy = autoscaling.MixedInstancesPolicy(
        launch_template=launch_template,
        launch_template_overrides=[
            autoscaling.LaunchTemplateOverrides(instance_type=ec2.InstanceType(t)) for t in instance_types
        ],
        instances_distribution=autoscaling.InstancesDistribution(
            on_demand_allocation_strategy=autoscaling.OnDemandAllocationStrategy.PRIORITIZED,
            on_demand_percentage_above_base_capacity=100,
        ),
    )
    return {"mixed_instances_policy": policy}


def is_arm64(instance_type: str) -> bool:
    """Whether ``instance_type`` is a Graviton (arm64) type, such as g5g."""
    return ec2.InstanceType(instance_type).architecture == ec2.InstanceArchitecture.ARM_64


def image_platform(instance_type: str) -> ecr_assets.Platform:
    """The Docker platform that runs on ``instance_type``: without it the image is built for the building machine's
    architecture, and one built on an arm64 laptop would not start on a g5."""
    return ecr_assets.Platform.LINUX_ARM64 if is_arm64(instance_type) else ecr_assets.Platform.LINUX_AMD64
