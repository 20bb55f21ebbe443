"""What the local runtime cannot run, and what checks it instead: the resource types it skips (``SKIPPED_TYPES``:
VPC, Auto Scaling, alarms, IAM...), each with the reason and the template test that holds it, and the properties of
deployed types it leaves out (``SKIPPED_PROPERTIES``), each with why. ``local_runtime.resource_types`` joins them to
what it deploys and emulates.
"""

from __future__ import annotations

from dataclasses import dataclass

_WORKERS_TEST = "tests/cdk/test_workers_and_scaling.py"
_API_TEST = "tests/cdk/test_api_and_permissions.py"
_STORAGE_TEST = "tests/cdk/test_storage_and_messaging.py"
_NOTIFY_TEST = "tests/cdk/test_notifications.py"


@dataclass(frozen=True)
class Skipped:
    """Why a resource type cannot run locally, and the test that checks it on the template instead."""

    reason: str
    checked_by: str  # "tests/...py::test_name"


def _skip(reason: str, checked_by: str) -> tuple[str, Skipped]:
    return "skip", Skipped(reason, checked_by)


SKIPPED_TYPES: dict[str, tuple[str, Skipped]] = {
    "AWS::CDK::Metadata": _skip("CDK's own usage metadata; nothing to run", "tests/local/test_deployer_coverage.py"),
    "AWS::Lambda::Permission": _skip(
        "resource policies: the local runtime invokes functions itself and moto enforces no IAM", _API_TEST
    ),
    "AWS::IAM::Role": _skip("moto enforces no IAM: each principal's grants are checked on the template", _API_TEST),
    "AWS::IAM::Policy": _skip("as AWS::IAM::Role", _API_TEST),
    "AWS::IAM::InstanceProfile": _skip("GPU instances do not run here", _WORKERS_TEST),
    "AWS::S3::BucketPolicy": _skip(
        "the local endpoint is plain HTTP and moto enforces bucket policies, so the TLS-only deny would refuse every "
        "call; the policy (TLS only, presigned-URL expiry) is checked on the template",
        _STORAGE_TEST,
    ),
    "AWS::ApiGateway::Account": _skip("account-wide CloudWatch role for API Gateway logs", _API_TEST),
    "AWS::CloudWatch::Alarm": _skip("moto emits no SQS metrics, so no alarm could ever change state", _NOTIFY_TEST),
    "AWS::CloudWatch::Dashboard": _skip("nothing to render locally", _NOTIFY_TEST),
    "AWS::ApplicationAutoScaling::ScalableTarget": _skip(
        "scaling acts on CloudWatch alarms and an ECS service, neither of which runs here; the local runtime runs "
        "WORKERS workers",
        _WORKERS_TEST,
    ),
    "AWS::ApplicationAutoScaling::ScalingPolicy": _skip("as ScalableTarget", _WORKERS_TEST),
    "AWS::AutoScaling::AutoScalingGroup": _skip("no EC2 instances here", _WORKERS_TEST),
    "AWS::AutoScaling::WarmPool": _skip("no EC2 instances here", _WORKERS_TEST),
    "AWS::AutoScaling::LifecycleHook": _skip("no EC2 instances here", "tests/cdk/test_warm_pool.py"),
    "AWS::Events::Rule": _skip(
        "its targets act on or report EC2 instances and ECS tasks (the GPU instance release, failed launches and "
        "stopped tasks to the alarm topic); none here",
        "tests/cdk/test_operations_alarms.py",
    ),
    "AWS::ECS::CapacityProvider": _skip("no EC2 instances here", _WORKERS_TEST),
    "AWS::ECS::ClusterCapacityProviderAssociations": _skip("no EC2 instances here", _WORKERS_TEST),
    "AWS::EC2::VPC": _skip("processes share 127.0.0.1; no network to build", _WORKERS_TEST),
    "AWS::EC2::Subnet": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::RouteTable": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::SubnetRouteTableAssociation": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::Route": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::InternetGateway": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::VPCGatewayAttachment": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::EIP": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::NatGateway": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::VPCEndpoint": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::SecurityGroup": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::FlowLog": _skip("as EC2::VPC", _WORKERS_TEST),
    "AWS::EC2::LaunchTemplate": _skip("no EC2 instances here", _WORKERS_TEST),
    "Custom::VpcRestrictDefaultSG": _skip("as EC2::VPC", _WORKERS_TEST),
}

# Properties of deployed types that are not applied locally, and why; every other property of a deployed type is
# applied by its handler (tests/local/test_deployer_coverage.py checks the template holds no property outside both).
SKIPPED_PROPERTIES: dict[tuple[str, str], str] = {
    ("AWS::S3::Bucket", "LoggingConfiguration"): "no log delivery locally (moto also wants the log bucket's policy, "
    "which is skipped with AWS::S3::BucketPolicy)",
    ("AWS::SNS::Topic", "Tags"): "tags change nothing locally",
    ("AWS::SQS::Queue", "Tags"): "tags change nothing locally",
    ("AWS::DynamoDB::Table", "Tags"): "tags change nothing locally",
    ("AWS::KMS::Key", "KeyPolicy"): "moto enforces no key policies",
    ("AWS::KMS::Key", "Tags"): "tags change nothing locally",
    ("AWS::SecretsManager::Secret", "Tags"): "tags change nothing locally",
    ("AWS::SecretsManager::Secret", "KmsKeyId"): "moto encrypts nothing",
    ("AWS::SSM::Parameter", "Tier"): "moto stores a parameter of any tier alike",
    ("AWS::Logs::LogGroup", "Tags"): "tags change nothing locally",
    ("AWS::ApiGateway::RestApi", "EndpointConfiguration"): "the local gateway serves 127.0.0.1",
    ("AWS::ApiGateway::RestApi", "ApiKeySourceType"): "read by the local gateway from the template",
    ("AWS::ApiGateway::RestApi", "BinaryMediaTypes"): "read by the local gateway from the template",
    ("AWS::ApiGateway::RestApi", "Policy"): "moto enforces no resource policies",
    ("AWS::ApiGateway::ApiKey", "StageKeys"): "the local gateway checks keys against usage plans",
    ("AWS::ECS::Service", "CapacityProviderStrategy"): "no instances here, so no capacity provider (it is skipped); "
    "moto places no tasks and the local supervisor runs WORKERS workers",
    ("AWS::ECS::Service", "DeploymentConfiguration"): "no deployments happen locally; checked on the template "
    "(tests/cdk/test_workers_and_scaling.py)",
    ("AWS::ECS::Service", "AvailabilityZoneRebalancing"): "one machine, no zones",
    ("AWS::ECS::Service", "EnableECSManagedTags"): "tags change nothing locally",
    ("AWS::ECS::Service", "LoadBalancers"): "the worker serves no traffic (the template's list is empty)",
    ("AWS::ECS::Service", "Tags"): "tags change nothing locally",
    ("AWS::ECS::TaskDefinition", "Tags"): "tags change nothing locally",
    ("AWS::ECS::TaskDefinition", "RequiresCompatibilities"): "moto refuses EC2 with a container that sets only a "
    "memory reservation (ECS takes it); checked on the template (tests/cdk/test_workers_and_scaling.py)",
}
