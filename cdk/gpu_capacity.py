"""GPU capacity that comes fast and goes promptly: a warm pool of stopped, pre-initialized instances, and the release
of instances that run no task."""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from async_inference.config import ENV_WORKER_CLUSTER, ENV_WORKER_GROUP
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix

# vLLM keeps its torch.compile cache under VLLM_CACHE_ROOT (default ~/.cache/vllm, inside the container, lost with it).
# Under the host volume that holds the weights, it survives the task and, in a warm pool, the instance's stop.
VLLM_CACHE_ROOT = "/models/vllm-cache"
RELEASE_EVERY = Duration.minutes(1)


class GpuCapacity(Construct):
    """A warm pool beside the GPU Auto Scaling group, and a function that releases the instances that run no task.

    * Warm pool (``warm_instances`` > 0): instances kept *stopped* (EC2 Auto Scaling warm pools, pool state Stopped:
      a stopped instance pays for its EBS volume only), returned to the pool on scale-in (``ReuseOnScaleIn``), so an
      instance that served once keeps the image layers, the weights (the task definition's host volume) and vLLM's
      compile cache (``VLLM_CACHE_ROOT`` set under that volume) for its next start: a boot and an engine start instead
      of a fresh instance's boot, image pull, download and compile. ECS needs ``ECS_WARM_POOLS_CHECK=true`` so that
      an instance being initialized for the pool does not register with the cluster ("Configuring pre-initialized
      instances for your Amazon ECS Auto Scaling group", ECS Developer Guide).
    * Instance release (``release_empty``): once a minute, ``async_inference.instance_release`` drains the instances
      that run no task, checks them again and gives them back to the group (to the warm pool when there is one),
      never one with a task: ECS managed scaling alone keeps an empty GPU instance for 15 minutes.
    * Instance start on wake (``grant_instance_start``): a function that wakes the worker service from zero may also
      raise this group from 0 to 1 instance (``async_inference.wake``), so the instance starts at once rather than
      after managed scaling's next CapacityProviderReservation minute.

    :param auto_scaling_group: the GPU group of the capacity provider (managed scaling and managed termination
        protection on).
    :param cluster: the ECS cluster.
    :param container: the worker container (gets ``VLLM_CACHE_ROOT``).
    :param code: the shared Lambda code (the release function).
    :param warm_instances: stopped instances to keep in the pool. Default: 0 (no pool).
    :param release_empty: release empty instances once a minute. Default: True.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        auto_scaling_group: autoscaling.AutoScalingGroup,
        cluster: ecs.ICluster,
        container: ecs.ContainerDefinition,
        code: LambdaCode,
        warm_instances: int = 0,
        release_empty: bool = True,
    ) -> None:
        super().__init__(scope, id)
        if warm_instances < 0:
            raise ValueError(f"warm_instances ({warm_instances}) must not be negative")
        container.add_environment("VLLM_CACHE_ROOT", VLLM_CACHE_ROOT)
        self.warm_pool = None
        if warm_instances:
            auto_scaling_group.add_user_data("echo ECS_WARM_POOLS_CHECK=true >> /etc/ecs/ecs.config")
            self.warm_pool = auto_scaling_group.add_warm_pool(
                min_size=warm_instances, pool_state=autoscaling.PoolState.STOPPED, reuse_on_scale_in=True
            )
        self.auto_scaling_group = auto_scaling_group
        self.release_function = None
        if release_empty:
            self.release_function = self._release(auto_scaling_group, cluster, code)

    def grant_instance_start(self, function: lambda_.Function, *, environment: bool = True) -> None:
        """Let ``function`` (one that wakes the worker service) start a GPU instance: the group's name in its
        environment, SetDesiredCapacity on this one group, and DescribeAutoScalingGroups (no resource-level
        permission exists for it) to see that the group is at 0 first. ``environment`` False: the permissions only
        (a further model's group, named in the function's MODEL_FLEETS routes instead)."""
        group = self.auto_scaling_group
        if environment:
            function.add_environment(ENV_WORKER_GROUP, group.auto_scaling_group_name)
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:SetDesiredCapacity"], resources=[self._group_arn(group)])
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"])
        )
        stack = Stack.of(self)
        acknowledge(
            function,
            {
                "AwsSolutions-IAM5[Resource::*]": "DescribeAutoScalingGroups supports no resource-level permission; "
                "the wake reads only the GPU group's desired capacity.",
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{rendered_account(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/<{stack.get_logical_id(group.node.default_child)}>]": "An "
                "Auto Scaling group's ARN holds a generated id; the statement names the one GPU group by name.",
            },
        )

    def _group_arn(self, group: autoscaling.AutoScalingGroup) -> str:
        """The group's ARN by its name (its id part is generated, so a wildcard stands for it)."""
        return Stack.of(self).format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{group.auto_scaling_group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
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
                resources=[self._group_arn(group)],
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
