"""GPU capacity that comes fast and goes promptly: a warm pool of stopped, pre-initialized instances, and the release
of instances that run no task."""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from async_inference.config import ENV_MODEL_DIR, ENV_MODEL_S3_URI, ENV_WORKER_CLUSTER
from cdk.fleet_lifecycle import FleetLifecycle
from cdk.gpu_worker_service import MODEL_CACHE_HOST_PATH, MODELS_CONTAINER_PATH, GpuWorkerService, group_arn
from cdk.lambda_code import LambdaCode
from cdk.model_store import ModelStore
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix, rendered_reference

# vLLM keeps its torch.compile cache under VLLM_CACHE_ROOT (default ~/.cache/vllm, inside the container, lost with it).
# Under the host volume that holds the weights, it survives the task: a later task on the same instance skips the
# compile (a pool instance has none: its pre-initialization runs no engine).
VLLM_CACHE_ROOT = "/models/vllm-cache"
RELEASE_EVERY = Duration.minutes(1)
# The launch lifecycle hook that holds an instance launched into the warm pool (Warmed:Pending:Wait) until its user data
# pulled the image and fetched the weights, and holds every start (Pending:Wait) until the per-boot script completes it.
# Named, because the script on the instance completes it by name.
POOL_INIT_HOOK_NAME = "async-inference-pool-init"
# Longer than a pool initialization (image pull about 5 minutes, weights well under one: bench/scaling/figures.py);
# the script always completes the action (an EXIT trap), so the timeout only matters if the script cannot run at all,
# and then CONTINUE: the instance is stopped or serves without the prefetch (its first task pulls, as without a pool).
POOL_INIT_TIMEOUT = Duration.minutes(20)
# cloud-init runs the scripts in this directory on every boot (module scripts-per-boot); user data itself runs once.
PER_BOOT_SCRIPT = "/var/lib/cloud/scripts/per-boot/async-inference-pool-init.sh"
# What vLLM reads of a Hugging Face model repository: config, tokenizer, safetensors weights (no duplicate formats).
HF_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


class GpuCapacity(Construct):
    """A warm pool beside the GPU Auto Scaling group, and a function that releases the instances that run no task.

    * Warm pool (``warm_instances`` > 0): instances kept *stopped* (EC2 Auto Scaling warm pools, pool state Stopped:
      a stopped instance pays for its EBS volume only), ``warm_instances`` of them at all times (``MinSize`` and
      ``MaxGroupPreparedCapacity`` both ``warm_instances``: "only when MaxGroupPreparedCapacity and MinSize are set to
      the same value does the warm pool have an absolute size", PutWarmPool, EC2 Auto Scaling API Reference; without
      ``MaxGroupPreparedCapacity`` it would hold the group's MaxSize minus its desired capacity). They are
      *pre-initialized*: an instance launched into the pool pulls
      the worker image and fetches the weights onto the task's host volume (``MODEL_CACHE_HOST_PATH``, where the
      worker reads them) before it is stopped, held there by a launch lifecycle hook (``POOL_INIT_HOOK_NAME``) that
      its script completes; a start from the pool is then a boot and an engine start. No ``ReuseOnScaleIn``: "you
      cannot set" it for a group used by ECS ("Configuring pre-initialized instances for your Amazon ECS Auto Scaling
      group", ECS Developer Guide; awsdocs/amazon-ecs-developer-guide#216: the API accepts it and the capacity
      provider's scale-in breaks), so a released instance is terminated and the pool launches and pre-initializes a
      fresh one in its place. ECS needs ``ECS_WARM_POOLS_CHECK=true`` (same page) so that an instance initializing for the pool
      does not register with the cluster. vLLM's compile cache (``VLLM_CACHE_ROOT``, under the host volume) is not
      pre-filled: the first task on each instance compiles.
    * Instance release (``release_empty``): once a minute, ``async_inference.instance_release`` drains the instances
      that run no task, checks them again and gives them back to the group (to the warm pool when there is one),
      never one with a task: ECS managed scaling alone keeps an empty GPU instance for 15 minutes.
    * Instance start on wake (``grant_instance_start``): a function that wakes the worker service from zero may also
      raise this group from 0 to 1 instance (``async_inference.wake``), so the instance starts at once rather than
      after managed scaling's next CapacityProviderReservation minute.

    * Deploy and delete steps (``lifecycle``, ``cdk.fleet_lifecycle.FleetLifecycle``): the worker service created at
      0 tasks and kept at its own count by later deploys, and the scale-in protections lifted before the service and
      the group are deleted.

    :param workers: the fleet's worker service (the deploy and delete steps act on its service, capacity provider and
        group).
    :param auto_scaling_group: the GPU group of the capacity provider (managed scaling and managed termination
        protection on).
    :param cluster: the ECS cluster.
    :param container: the worker container (gets ``VLLM_CACHE_ROOT``).
    :param code: the shared Lambda code (the release function).
    :param warm_instances: stopped instances the pool keeps. Default: 0 (no pool).
    :param model: the model's Hugging Face name, fetched into the image's HF_HOME on the host volume at pool
        initialization (without ``models``). Default: none (no weights fetched, the image only).
    :param models: the model's S3 store: the pool initialization syncs it into its ``MODEL_DIR`` with the worker's own
        ``gpu_worker.model_source`` (so the worker keeps the files), and the instance role may read it. Default: none.
    :param release_empty: release empty instances once a minute. Default: True.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        workers: GpuWorkerService,
        auto_scaling_group: autoscaling.AutoScalingGroup,
        cluster: ecs.ICluster,
        container: ecs.ContainerDefinition,
        code: LambdaCode,
        warm_instances: int = 0,
        release_empty: bool = True,
        model: str | None = None,
        models: ModelStore | None = None,
    ) -> None:
        super().__init__(scope, id)
        if warm_instances < 0:
            raise ValueError(f"warm_instances ({warm_instances}) must not be negative")
        container.add_environment("VLLM_CACHE_ROOT", VLLM_CACHE_ROOT)
        self.warm_pool = None
        self.pool_init_hook = None
        self.pool_init_policy = None
        self.auto_scaling_group = auto_scaling_group
        if warm_instances:
            auto_scaling_group.add_user_data("echo ECS_WARM_POOLS_CHECK=true >> /etc/ecs/ecs.config")
            self._pre_initialize(auto_scaling_group, container, model, models)
            # MinSize and MaxGroupPreparedCapacity equal: a pool of that absolute size (PutWarmPool). Without the
            # latter the pool would hold the group's MaxSize minus its desired capacity, more than asked for.
            self.warm_pool = auto_scaling_group.add_warm_pool(
                min_size=warm_instances,
                max_group_prepared_capacity=warm_instances,
                pool_state=autoscaling.PoolState.STOPPED,
            )
            # The pool's first instances launch once it exists: the hook must hold them and the role let them finish.
            self.warm_pool.node.add_dependency(self.pool_init_hook, self.pool_init_policy)
        self.lifecycle = FleetLifecycle(self, "Lifecycle", workers=workers, code=code)
        self.release_function = None
        if release_empty:
            self.release_function = self._release(auto_scaling_group, cluster, code)

    def _pre_initialize(
        self,
        group: autoscaling.AutoScalingGroup,
        container: ecs.ContainerDefinition,
        model: str | None,
        models: ModelStore | None,
    ) -> None:
        """The launch hook, the per-boot script that completes it (pulling the image and fetching the weights first when
        the instance's target is the warm pool), and the instance role's rights for it.

        The EC2 Auto Scaling User Guide ("Use lifecycle hooks with a warm pool"): Auto Scaling does not wait for user
        data before it stops a pool instance, unless a launch hook holds it in Warmed:Pending:Wait; the same hook holds
        the instance again in Pending:Wait when it leaves the pool, and cloud-init runs user data on the first boot
        only, so the script lies in cloud-init's per-boot directory and runs again on that start (where it only
        completes the action). The instance reads its target (``autoscaling/target-lifecycle-state``, instance
        metadata) and its group (DescribeAutoScalingInstances: the group's name in its own launch template would be a
        dependency cycle)."""
        stack = Stack.of(self)
        self.pool_init_hook = group.add_lifecycle_hook(
            "PoolInit",
            lifecycle_hook_name=POOL_INIT_HOOK_NAME,
            lifecycle_transition=autoscaling.LifecycleTransition.INSTANCE_LAUNCHING,
            default_result=autoscaling.DefaultResult.CONTINUE,
            heartbeat_timeout=POOL_INIT_TIMEOUT,
        )
        fetch = _weights_fetch(model, models)
        script = [
            "#!/bin/bash",
            "# async-inference: pre-initialize a warm-pool instance, then complete the launch lifecycle action.",
            "set -uo pipefail",
            f"IMAGE='{container.image_name}'",
            f"REGION='{stack.region}'",
            f"HOOK='{POOL_INIT_HOOK_NAME}'",
            "imds() {",
            "  local token",
            "  token=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' "
            "http://169.254.169.254/latest/api/token) &&",
            '  curl -sf -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"',
            "}",
            "command -v aws >/dev/null || dnf install -y awscli-2",
            "INSTANCE=$(imds instance-id)",
            "STATE=''",
            'for _ in $(seq 60); do STATE=$(imds autoscaling/target-lifecycle-state) && [ -n "$STATE" ] && break; '
            "sleep 5; done",
            # Warmed:* instances are listed too (AutoScalingInstanceDetails.LifecycleState has the Warmed states).
            "GROUP=''",
            'for _ in $(seq 10); do GROUP=$(aws autoscaling describe-auto-scaling-instances --region "$REGION" '
            "--instance-ids \"$INSTANCE\" --query 'AutoScalingInstances[0].AutoScalingGroupName' --output text) && "
            '[ -n "$GROUP" ] && [ "$GROUP" != None ] && break; sleep 3; done',
            "complete_action() {",
            '  aws autoscaling complete-lifecycle-action --region "$REGION" --auto-scaling-group-name "$GROUP" '
            '--lifecycle-hook-name "$HOOK" --instance-id "$INSTANCE" --lifecycle-action-result CONTINUE',
            "}",
            "trap complete_action EXIT",
            '[[ "$STATE" == Warmed:* ]] || exit 0  # a start into service: nothing to fetch',
            # --no-block and a wait: a unit ordered after cloud-final (as ecs.service is) would deadlock a blocking start
            # from user data; docker is not, but the script does not rest on it.
            "systemctl start --no-block docker",
            "for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 2; done",
            'aws ecr get-login-password --region "$REGION" | '
            'docker login --username AWS --password-stdin "${IMAGE%%/*}"',
            'docker pull "$IMAGE"',
            *fetch,
        ]
        group.add_user_data(
            f"mkdir -p {MODEL_CACHE_HOST_PATH} $(dirname {PER_BOOT_SCRIPT})",
            f"cat > {PER_BOOT_SCRIPT} <<'POOL_INIT'",
            *script,
            "POOL_INIT",
            f"chmod 755 {PER_BOOT_SCRIPT}",
            # Per-boot scripts run before user data on the first boot, so the first run is this one.
            PER_BOOT_SCRIPT,
        )
        role = group.role
        self.pool_init_policy = iam.Policy(
            self,
            "PoolInitPolicy",
            roles=[role],
            statements=[
                iam.PolicyStatement(actions=["autoscaling:CompleteLifecycleAction"], resources=[group_arn(group)]),
                # No resource-level permission exists for it.
                iam.PolicyStatement(actions=["autoscaling:DescribeAutoScalingInstances"], resources=["*"]),
            ],
        )
        acknowledge(
            self.pool_init_policy,
            {
                "AwsSolutions-IAM5[Resource::*]": "DescribeAutoScalingInstances supports no resource-level permission; "
                "the instance reads its own group's name with it.",
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{rendered_account(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/<{stack.get_logical_id(group.node.default_child)}>]": "An "
                "Auto Scaling group's ARN holds a generated id; the statement names the one GPU group by name.",
            },
        )
        # The agent's pull uses the task's execution role; the script pulls with the instance role, so it gets the same
        # pull on the image's repository (ecr:GetAuthorizationToken it has from the cluster already).
        for asset in container.node.children:
            if isinstance(asset, ecr_assets.DockerImageAsset):
                asset.repository.grant_pull(role)
        if models is not None:
            models.grant_read(role)

    def grant_instance_start(self, function: lambda_.Function) -> None:
        """Let ``function`` (one that wakes the worker service; its fleet's route names the group) start a GPU
        instance: SetDesiredCapacity on this one group, and DescribeAutoScalingGroups (no resource-level permission
        exists for it) to see that the group is at 0 first."""
        group = self.auto_scaling_group
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:SetDesiredCapacity"], resources=[group_arn(group)])
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"])
        )
        stack = Stack.of(function)  # the group's name as the function's template refers to it (cdk.nag)
        name = rendered_reference(function, group.node.default_child)
        acknowledge(
            function,
            {
                "AwsSolutions-IAM5[Resource::*]": "DescribeAutoScalingGroups supports no resource-level permission; "
                "the wake reads only the GPU group's desired capacity.",
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{rendered_account(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/{name}]": "An "
                "Auto Scaling group's ARN holds a generated id; the statement names the one GPU group by name.",
            },
        )

    def grant_capacity_read(self, function: lambda_.Function) -> None:
        """Let ``function`` (the API's, for GET /v1/models: ``async_inference.capacity_state``) read this group's
        latest scaling activity: DescribeScalingActivities, which supports no resource-level permission (the
        function's X-Ray statement already acknowledges Resource::* on its role)."""
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:DescribeScalingActivities"], resources=["*"])
        )

    def _release(self, group: autoscaling.AutoScalingGroup, cluster: ecs.ICluster, code: LambdaCode):
        function = code.new_function(
            self,
            "Release",
            handler="lambdas.instance_release.handler.lambda_handler",
            description="Releases the GPU instances that run no task (drained and checked first)",
            service_name="async-inference-instance-release",
            # The cluster only: the function reads its capacity providers' groups from ECS (a Ref to the group would
            # be one more name to keep in step, and one the local runtime, which runs no group, cannot resolve).
            environment={ENV_WORKER_CLUSTER: cluster.cluster_name},
            timeout=Duration.seconds(30),
        )
        stack = Stack.of(self)
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:ListContainerInstances", "ecs:DescribeClusters"], resources=[cluster.cluster_arn]
            )
        )
        # Nothing is released while a service of the cluster has tasks to place (async_inference.instance_release):
        # ListServices takes no resource, only the ecs:cluster condition (Service Authorization Reference, Amazon ECS);
        # DescribeServices names the cluster's services.
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:ListServices"],
                resources=["*"],
                conditions={"ArnEquals": {"ecs:cluster": cluster.cluster_arn}},
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:DescribeServices"],
                resources=[
                    stack.format_arn(service="ecs", resource="service", resource_name=f"{cluster.cluster_name}/*")
                ],
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:DescribeCapacityProviders"],
                resources=[stack.format_arn(service="ecs", resource="capacity-provider", resource_name="*")],
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:DescribeContainerInstances", "ecs:UpdateContainerInstancesState"],
                resources=[
                    stack.format_arn(
                        service="ecs", resource="container-instance", resource_name=f"{cluster.cluster_name}/*"
                    )
                ],
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["autoscaling:SetInstanceProtection", "autoscaling:SetDesiredCapacity"],
                resources=[group_arn(group)],
            )
        )
        # DescribeAutoScalingGroups supports no resource-level permission; the function's own X-Ray statement already
        # acknowledges Resource::* on this role (cdk.lambda_code).
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"])
        )
        cluster_id = stack.get_logical_id(cluster.node.default_child)
        group_id = stack.get_logical_id(group.node.default_child)
        account = rendered_account(stack)
        acknowledge(
            function,
            {
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'ecs')}:{account}:capacity-provider/*]": "DescribeCapacityProviders, read-only, to find the cluster's group; the provider's name is generated.",
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'ecs')}:{account}:container-instance/"
                f"<{cluster_id}>/*]": "Container instance ids are assigned at launch; the statement admits only this "
                "cluster's instances, to describe them and set them DRAINING or ACTIVE.",
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'ecs')}:{account}:service/<{cluster_id}>/*]": "DescribeServices, read-only, on this cluster's services: their desired and running counts say "
                "whether a task waits to be placed (then nothing is released).",
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{account}:autoScalingGroup:*:"
                f"autoScalingGroupName/<{group_id}>]": "An Auto Scaling group's ARN holds a generated id; the statement "
                "names the one GPU group by name.",
            },
        )
        events.Rule(
            self,
            "EveryMinute",
            schedule=events.Schedule.rate(RELEASE_EVERY),
            targets=[targets.LambdaFunction(function)],
        )
        return function


def _weights_fetch(model: str | None, models: ModelStore | None) -> list[str]:
    """Shell lines that fetch the weights onto the host volume with the worker image (its own code and HF_HOME), so
    the worker finds them where it looks: ``MODEL_DIR`` with the sync's manifest (S3), or the Hub cache under HF_HOME.
    Host networking: the container reaches instance metadata (hop limit 1) for the instance role's credentials."""
    run = (
        f'docker run --rm --network host -v {MODEL_CACHE_HOST_PATH}:{MODELS_CONTAINER_PATH} -e AWS_REGION="$REGION" '
        '-e AWS_DEFAULT_REGION="$REGION" --entrypoint python3 "$IMAGE" -c'
    )
    if models is not None:
        uri, directory = models.environment[ENV_MODEL_S3_URI], models.environment[ENV_MODEL_DIR]
        code = (
            "from pathlib import Path; from gpu_worker.model_source import ModelSource; "
            f'ModelSource("{uri}", Path("{directory}")).sync()'
        )
        return [f"{run} '{code}'"]
    if model:
        code = (
            "from huggingface_hub import snapshot_download; "
            f'snapshot_download("{model}", allow_patterns={HF_ALLOW_PATTERNS!r})'
        )
        # A gated model needs HF_TOKEN, which only the task gets: the fetch fails, the task downloads as before.
        return [f"{run} '{code.replace(chr(39), chr(34))}'"]
    return []
