"""The workers' network and cluster: a VPC and the ECS cluster every model's fleet runs its GPU instances in."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk.nag import acknowledge


class WorkerCluster(Construct):
    """A VPC and an ECS cluster (Container Insights on) that every fleet's worker service joins
    (:class:`cdk.gpu_worker_service.GpuWorkerService`, as ``ecs_patterns.QueueProcessingServiceBase`` takes an
    existing cluster and VPC).

    Private subnets by default: S3 and DynamoDB through gateway endpoints and ECR and CloudWatch Logs through interface
    endpoints, which keeps the multi-gigabyte image pulls off the NAT gateway; the NAT gateway remains for SQS, SNS and
    the model download from Hugging Face. With ``public_subnets``, public subnets instead, each instance with a public
    IPv4 address and a security group that admits nothing inbound: no NAT gateway and no interface endpoints (about $77
    a month at us-east-1 list prices while scaled to zero), the gateway endpoints kept.

    :param nat_gateways: NAT gateways of the VPC (private subnets only). Default: 1.
    :param public_subnets: the instances in public subnets with public IPv4 addresses, no NAT gateway and no
        interface endpoints. Default: False.
    :param availability_zones: the VPC's zones. Default: none, the region's first two.
    :param log_retention: flow log retention. Default: one month.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        nat_gateways: int = 1,
        public_subnets: bool = False,
        availability_zones: Sequence[str] = (),
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        self.public_subnets = public_subnets
        self.vpc = self._vpc(nat_gateways, availability_zones, log_retention)
        self.cluster = ecs.Cluster(self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED)

    def _vpc(self, nat_gateways: int, availability_zones: Sequence[str], log_retention: logs.RetentionDays) -> ec2.Vpc:
        if self.public_subnets:
            subnets = [ec2.SubnetConfiguration(name="workers", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=20)]
        else:
            subnets = [
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(name="workers", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20),
            ]
        vpc = ec2.Vpc(
            self,
            "Vpc",
            # Given zones, or the region's first two (which may not offer the GPU type: `async-inference preflight`).
            **({"availability_zones": list(availability_zones)} if availability_zones else {"max_azs": 2}),
            nat_gateways=0 if self.public_subnets else nat_gateways,
            subnet_configuration=subnets,
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
                "DynamoDB": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
            },
        )
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(
                logs.LogGroup(self, "FlowLogs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
            ),
        )
        if self.public_subnets:
            return vpc  # ECR and CloudWatch Logs over the internet gateway: no endpoint to pay while idle
        for name, service in {
            "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
            "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
            "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
        }.items():
            endpoint = vpc.add_interface_endpoint(name, service=service, private_dns_enabled=True)
            acknowledge(
                endpoint,
                {
                    # cdk-nag cannot evaluate the CIDR token; the rule CDK writes admits port 443 from the VPC only.
                    "AwsSolutions-EC23": "Ingress is HTTPS from this VPC's own CIDR (the endpoint's default rule)."
                },
            )
        return vpc


class FleetCluster(Construct):
    """An ECS cluster of one fleet's own in ``network``'s VPC, for a fleet in a nested stack (``fleet_stacks``).

    A cluster's capacity providers are one resource (``AWS::ECS::ClusterCapacityProviderAssociations``) that each
    service waits on: with the cluster in the root stack, it would list every nested fleet's capacity provider while
    each nested service waited on it, a cycle between the stacks. A cluster costs nothing.
    """

    def __init__(self, scope: Construct, id: str, *, network: WorkerCluster) -> None:
        super().__init__(scope, id)
        self.public_subnets, self.vpc = network.public_subnets, network.vpc
        self.cluster = ecs.Cluster(self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED)
