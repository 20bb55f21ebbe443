"""A GPU fleet's deploy- and delete-time steps: its worker service created at 0 tasks and kept at its count on
updates, and the scale-in protections lifted before the service and the Auto Scaling group are deleted."""

from __future__ import annotations

from typing import cast

from aws_cdk import CustomResource, Duration, Stack, Token
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from async_inference.fleet_deploy_steps import (
    DESIRED_COUNT,
    DESIRED_COUNT_ATTRIBUTE,
    INSTANCE_PROTECTION_RELEASE,
    PROP_CLUSTER,
    PROP_GROUP,
    PROP_SERVICE,
    TASK_PROTECTION_RELEASE,
)
from cdk.gpu_worker_service import GpuWorkerService, group_arn
from cdk.lambda_code import LambdaCode
from cdk.nag import acknowledge, rendered_account, rendered_arn_prefix

STEPS_FUNCTION_ID = "FleetDeploySteps"


class FleetLifecycle(Construct):
    """Three custom resources around one fleet's worker service and GPU group, served by one function per stack
    (``async_inference.fleet_deploy_steps`` says what each does):

    * ``desired_count``: the service's DesiredCount reads its attribute, 0 when the stack is created (CloudFormation
      then waits for no GPU task, so a GPU quota of 0 or no capacity in the zones cannot roll back the API, queues
      and tables; the first job's wake starts the first task), the service's own count on every later deploy (its
      properties hold the task definition, so a deploy that changes the worker reads the count afresh).
    * ``task_protection_release``: depends on the service, so it is deleted first: the service to 0 tasks and its
      tasks' scale-in protection lifted.
    * ``instance_protection_release``: depends on the group, and the capacity provider on it, so it is deleted after
      the capacity provider and before the group: the instances' scale-in protection lifted.

    :param workers: the fleet's worker service (its ECS service, capacity provider and Auto Scaling group).
    :param code: the shared Lambda code (the steps' function, made once per stack).
    """

    def __init__(self, scope: Construct, id: str, *, workers: GpuWorkerService, code: LambdaCode) -> None:
        super().__init__(scope, id)
        function = steps_function(Stack.of(self), code)
        self.function = function
        cluster = workers.cluster.cluster_name
        service_props = {PROP_CLUSTER: cluster, PROP_SERVICE: workers.ecs_service_name}
        self.desired_count = CustomResource(
            self,
            "DesiredCount",
            service_token=function.function_arn,
            resource_type=DESIRED_COUNT,
            properties={**service_props, "TaskDefinition": workers.task_definition.task_definition_arn},
        )
        cfn_service = cast(ecs.CfnService, workers.service.node.default_child)
        cfn_service.add_property_override(
            "DesiredCount", Token.as_number(self.desired_count.get_att(DESIRED_COUNT_ATTRIBUTE))
        )
        self.task_protection_release = CustomResource(
            self,
            "TaskProtectionRelease",
            service_token=function.function_arn,
            resource_type=TASK_PROTECTION_RELEASE,
            properties=service_props,
        )
        self.task_protection_release.node.add_dependency(workers.service)
        group = workers.auto_scaling_group
        self.instance_protection_release = CustomResource(
            self,
            "InstanceProtectionRelease",
            service_token=function.function_arn,
            resource_type=INSTANCE_PROTECTION_RELEASE,
            properties={PROP_GROUP: group.auto_scaling_group_name},
        )
        workers.capacity_provider.node.add_dependency(self.instance_protection_release)
        self._grant(function, workers)

    def _grant(self, function: lambda_.Function, workers: GpuWorkerService) -> None:
        stack = Stack.of(self)
        cluster = workers.cluster
        service_arn = stack.format_arn(
            service="ecs", resource="service", resource_name=f"{cluster.cluster_name}/{workers.ecs_service_name}"
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["ecs:DescribeServices", "ecs:UpdateService"], resources=[service_arn])
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:ListTasks"],
                resources=["*"],
                conditions={"ArnEquals": {"ecs:cluster": cluster.cluster_arn}},
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["ecs:UpdateTaskProtection"],
                resources=[stack.format_arn(service="ecs", resource="task", resource_name=f"{cluster.cluster_name}/*")],
            )
        )
        group = workers.auto_scaling_group
        function.add_to_role_policy(
            iam.PolicyStatement(
                actions=["autoscaling:SetInstanceProtection"],
                resources=[group_arn(group)],
            )
        )
        function.add_to_role_policy(
            iam.PolicyStatement(actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"])
        )
        account = rendered_account(stack)
        cluster_id = stack.get_logical_id(cast(ecs.CfnCluster, cluster.node.default_child))
        group_id = stack.get_logical_id(group.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            function,
            {
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'ecs')}:{account}:task/<{cluster_id}>/*]": (
                    "Task ids are assigned at launch; the statement admits only this cluster's tasks, to lift their "
                    "protection when the service is deleted."
                ),
                f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'autoscaling')}:{account}:autoScalingGroup:*:"
                f"autoScalingGroupName/<{group_id}>]": "An Auto Scaling group's ARN holds a generated id; the "
                "statement names the GPU group by name.",
            },
        )


def steps_function(stack: Stack, code: LambdaCode) -> lambda_.Function:
    """The one function per stack that serves every fleet's custom resources."""
    existing = stack.node.try_find_child(STEPS_FUNCTION_ID)
    if isinstance(existing, lambda_.Function):
        return existing
    return code.new_function(
        stack,
        STEPS_FUNCTION_ID,
        handler="lambdas.fleet_deploy_steps.handler.lambda_handler",
        description="The GPU fleets' deploy and delete steps: the worker service's count, protections lifted",
        service_name="async-inference-fleet-deploy-steps",
        environment={},
        timeout=Duration.minutes(2),
    )
