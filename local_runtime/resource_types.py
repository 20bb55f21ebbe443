"""What the local deployer does with each resource type (``RESOURCE_TYPES``): the handlers that create a type in moto
from its resolved properties (``deploy``), the types the local runtime runs itself from the template (``emulate``),
and those that cannot run here, each with the reason and the template test that checks it instead (``skip``); the
properties each handler applies (``APPLIED_PROPERTIES``) and those it leaves out, with why (``SKIPPED_PROPERTIES``).
``local_runtime.deployer`` deploys a template with this table; ``deployable`` names what it would drop.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import TYPE_CHECKING, Any

from async_inference import fleet_deploy_steps
from local_runtime import moto_storage as storage
from local_runtime.not_deployed import SKIPPED_PROPERTIES, SKIPPED_TYPES, Skipped
from local_runtime.physical import Handler, Physical, arn_of
from local_runtime.template import LOCAL_REGION, Assembly, TemplateError

if TYPE_CHECKING:
    from local_runtime.deployer import Deployment

logger = logging.getLogger("local_runtime.deployer")


# --- API Gateway ----------------------------------------------------------------------------------------------------


def _rest_api(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    apigateway = d.client("apigateway")
    api = apigateway.create_rest_api(name=props.get("Name", logical_id), description=props.get("Description", ""))
    root = next(r["id"] for r in apigateway.get_resources(restApiId=api["id"])["items"] if r["path"] == "/")
    return Physical(logical_id, "AWS::ApiGateway::RestApi", ref=api["id"], attributes={"RootResourceId": root})


def _api_key(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("Name") or d.name_for(logical_id)
    value = props.get("Value") or d.api_key_values.get(name)
    if value is None:
        # In AWS, API Gateway generates a value; here too, and `make up` prints it.
        value = secrets.token_urlsafe(30)
        d.api_key_values[name] = value
    key = d.client("apigateway").create_api_key(
        name=name, value=value, enabled=props.get("Enabled", True), description=props.get("Description", "")
    )
    return Physical(logical_id, "AWS::ApiGateway::ApiKey", ref=key["id"], attributes={"APIKeyId": key["id"]})


def _usage_plan(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    request: dict[str, Any] = {"name": props.get("UsagePlanName") or d.name_for(logical_id)}
    if "Description" in props:
        request["description"] = props["Description"]
    if props.get("Throttle"):
        request["throttle"] = {_lower_first(k): v for k, v in props["Throttle"].items()}
    if props.get("Quota"):
        request["quota"] = {_lower_first(k): v for k, v in props["Quota"].items()}
    if props.get("ApiStages"):
        request["apiStages"] = [{"apiId": s["ApiId"], "stage": s["Stage"]} for s in props["ApiStages"]]
    plan = d.client("apigateway").create_usage_plan(**request)
    return Physical(logical_id, "AWS::ApiGateway::UsagePlan", ref=plan["id"], attributes={"Id": plan["id"]})


def _lower_first(name: str) -> str:
    return name[0].lower() + name[1:]


def _usage_plan_key(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    d.client("apigateway").create_usage_plan_key(
        usagePlanId=props["UsagePlanId"], keyId=props["KeyId"], keyType=props["KeyType"]
    )
    return Physical(logical_id, "AWS::ApiGateway::UsagePlanKey", ref=f"{props['UsagePlanId']}:{props['KeyId']}")


# --- ECS ------------------------------------------------------------------------------------------------------------


def _cluster(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("ClusterName") or d.name_for(logical_id, limit=255)
    request: dict[str, Any] = {"clusterName": name}
    if "ClusterSettings" in props:
        request["settings"] = [{"name": s["Name"], "value": s["Value"]} for s in props["ClusterSettings"]]
    if "Tags" in props:
        request["tags"] = [{"key": t["Key"], "value": t["Value"]} for t in props["Tags"]]
    arn = d.client("ecs").create_cluster(**request)["cluster"]["clusterArn"]
    return Physical(logical_id, "AWS::ECS::Cluster", ref=name, attributes={"Arn": arn})


# Maps whose keys are the user's (log driver options, labels), not property names: copied as they are.
_ECS_FREE_FORM_KEYS = {"Options", "DockerLabels", "SystemControls", "DriverOpts", "Labels"}


def _ecs_request(value: Any) -> Any:
    """CloudFormation's ECS properties (PascalCase) as the ECS API takes them (camelCase)."""
    if isinstance(value, list):
        return [_ecs_request(v) for v in value]
    if isinstance(value, dict):
        return {_lower_first(k): v if k in _ECS_FREE_FORM_KEYS else _ecs_request(v) for k, v in value.items()}
    return value


_TASK_DEFINITION_REQUEST = (
    "ContainerDefinitions",
    "Volumes",
    "NetworkMode",
    "TaskRoleArn",
    "ExecutionRoleArn",
    "Cpu",
    "Memory",
    "PlacementConstraints",
)


def _task_definition(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    """Registered in moto as ECS would hold it; the local runtime also runs its container (local_runtime.workers)."""
    family = props.get("Family") or d.name_for(logical_id, limit=255)
    request = {_lower_first(k): _ecs_request(props[k]) for k in _TASK_DEFINITION_REQUEST if k in props}
    arn = d.client("ecs").register_task_definition(family=family, **request)["taskDefinition"]["taskDefinitionArn"]
    return Physical(logical_id, "AWS::ECS::TaskDefinition", ref=arn, attributes={"TaskDefinitionArn": arn})


# CloudFormation's DesiredCount when a new service's template gives none (AWS::ECS::Service, DesiredCount).
CLOUDFORMATION_NEW_SERVICE_DESIRED_COUNT = 1


def _service(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("ServiceName") or d.name_for(logical_id, limit=255)
    request: dict[str, Any] = {
        "cluster": props["Cluster"],
        "serviceName": name,
        "taskDefinition": props["TaskDefinition"],
        "desiredCount": int(props.get("DesiredCount", CLOUDFORMATION_NEW_SERVICE_DESIRED_COUNT)),
    }
    for key in ("SchedulingStrategy", "LaunchType", "PlatformVersion", "PropagateTags"):
        if key in props:
            request[_lower_first(key)] = props[key]
    service = d.client("ecs").create_service(**request)["service"]
    return Physical(
        logical_id,
        "AWS::ECS::Service",
        ref=service["serviceArn"],
        attributes={"ServiceArn": service["serviceArn"], "Name": service["serviceName"]},
    )


def _fleet_step(resource_type: str) -> Handler:
    """A GPU fleet's custom resource (``async_inference.fleet_deploy_steps``): its Create step, run as its function
    runs it, against moto (the worker service's DesiredCount reads 0 from it)."""

    def handler(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
        event = {"ResourceType": resource_type, "RequestType": "Create", "ResourceProperties": props}
        result = fleet_deploy_steps.handle(event, ecs=d.client("ecs"), autoscaling=d.client("autoscaling"))
        return Physical(logical_id, resource_type, ref=result.physical_id, attributes=dict(result.data))

    return handler


# --- Emulated: run by the local runtime from the template -----------------------------------------------------------


def _function(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("FunctionName") or d.name_for(logical_id, limit=64)
    arn = arn_of("lambda", f"function:{name}")
    return Physical(logical_id, "AWS::Lambda::Function", ref=name, attributes={"Arn": arn})


def _layer(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("LayerName") or d.name_for(logical_id, limit=64)
    return Physical(logical_id, "AWS::Lambda::LayerVersion", ref=arn_of("lambda", f"layer:{name}:1"))


def _recorded(resource_type: str, ref_key: str | None = None) -> Handler:
    """A resource the local runtime reads from the template when it runs (nothing to create in moto)."""

    def handler(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
        ref = props.get(ref_key) if ref_key else None
        return Physical(logical_id, resource_type, ref=ref or d.name_for(logical_id))

    return handler


def _stage(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    return Physical(logical_id, "AWS::ApiGateway::Stage", ref=props.get("StageName", logical_id))


def _websocket_api(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    """An ``AWS::ApiGatewayV2::Api``, served by ``local_runtime.websocket_api``; its id is what API Gateway's look
    like (ten lowercase letters and digits), stable for a stack and logical id."""
    api_id = hashlib.sha1(f"{d.stack_name}/{logical_id}".encode()).hexdigest()[:10]
    endpoint = f"wss://{api_id}.execute-api.{LOCAL_REGION}.amazonaws.com"
    return Physical(
        logical_id, "AWS::ApiGatewayV2::Api", ref=api_id, attributes={"ApiId": api_id, "ApiEndpoint": endpoint}
    )


# --- The table ------------------------------------------------------------------------------------------------------

RESOURCE_TYPES: dict[str, tuple[str, Handler | Skipped | None]] = {
    # deployed into moto
    "AWS::S3::Bucket": ("deploy", storage.bucket),
    "Custom::S3BucketNotifications": ("deploy", storage.bucket_notifications),
    "AWS::SQS::Queue": ("deploy", storage.queue),
    "AWS::SQS::QueuePolicy": ("deploy", storage.queue_policy),
    "AWS::SNS::Topic": ("deploy", storage.topic),
    "AWS::SNS::TopicPolicy": ("deploy", storage.topic_policy),
    "AWS::SNS::Subscription": ("deploy", storage.subscribe),
    "AWS::DynamoDB::Table": ("deploy", storage.table),
    "AWS::KMS::Key": ("deploy", storage.key),
    "AWS::SecretsManager::Secret": ("deploy", storage.secret),
    "AWS::SSM::Parameter": ("deploy", storage.parameter),
    "AWS::Logs::LogGroup": ("deploy", storage.log_group),
    "AWS::ApiGateway::RestApi": ("deploy", _rest_api),
    "AWS::ApiGateway::ApiKey": ("deploy", _api_key),
    "AWS::ApiGateway::UsagePlan": ("deploy", _usage_plan),
    "AWS::ApiGateway::UsagePlanKey": ("deploy", _usage_plan_key),
    "AWS::ECS::Cluster": ("deploy", _cluster),
    # registered in moto, and its container run by the local runtime's supervisor (local_runtime/workers.py)
    "AWS::ECS::TaskDefinition": ("deploy", _task_definition),
    "AWS::ECS::Service": ("deploy", _service),
    **{kind: ("deploy", _fleet_step(kind)) for kind in fleet_deploy_steps.RESOURCE_TYPES},
    # emulated by the local runtime, from the template
    "AWS::Lambda::Function": ("emulate", _function),
    "AWS::Lambda::LayerVersion": ("emulate", _layer),
    "AWS::Lambda::EventSourceMapping": ("emulate", _recorded("AWS::Lambda::EventSourceMapping")),
    "AWS::Lambda::EventInvokeConfig": ("emulate", _recorded("AWS::Lambda::EventInvokeConfig")),
    "AWS::ApiGateway::Resource": ("emulate", _recorded("AWS::ApiGateway::Resource")),
    "AWS::ApiGateway::Method": ("emulate", _recorded("AWS::ApiGateway::Method")),
    "AWS::ApiGateway::Model": ("emulate", _recorded("AWS::ApiGateway::Model", "Name")),
    "AWS::ApiGateway::RequestValidator": ("emulate", _recorded("AWS::ApiGateway::RequestValidator")),
    "AWS::ApiGateway::GatewayResponse": ("emulate", _recorded("AWS::ApiGateway::GatewayResponse")),
    "AWS::ApiGateway::Deployment": ("emulate", _recorded("AWS::ApiGateway::Deployment")),
    "AWS::ApiGateway::Stage": ("emulate", _stage),
    "AWS::ApiGateway::Authorizer": ("emulate", _recorded("AWS::ApiGateway::Authorizer")),
    # the WebSocket API, served by local_runtime.websocket_api from these (its routes invoke the template's functions)
    "AWS::ApiGatewayV2::Api": ("emulate", _websocket_api),
    "AWS::ApiGatewayV2::Route": ("emulate", _recorded("AWS::ApiGatewayV2::Route")),
    "AWS::ApiGatewayV2::RouteResponse": ("emulate", _recorded("AWS::ApiGatewayV2::RouteResponse")),
    "AWS::ApiGatewayV2::Integration": ("emulate", _recorded("AWS::ApiGatewayV2::Integration")),
    "AWS::ApiGatewayV2::Stage": ("emulate", _recorded("AWS::ApiGatewayV2::Stage", "StageName")),
    # cannot run here: what checks each instead (local_runtime.not_deployed)
    **SKIPPED_TYPES,
}

# Properties each deploy handler applies (the coverage test compares the template with these and the list above).
APPLIED_PROPERTIES: dict[str, set[str]] = {
    "AWS::S3::Bucket": {
        "BucketName",
        "VersioningConfiguration",
        "BucketEncryption",
        "LifecycleConfiguration",
        "CorsConfiguration",
        "PublicAccessBlockConfiguration",
        "OwnershipControls",
        "NotificationConfiguration",
        "Tags",
    },
    "Custom::S3BucketNotifications": {
        "ServiceToken",
        "BucketName",
        "NotificationConfiguration",
        "Managed",
        "SkipDestinationValidation",
    },
    "AWS::SQS::Queue": {"QueueName", "RedrivePolicy", "RedriveAllowPolicy", *storage.QUEUE_ATTRIBUTES},
    "AWS::SQS::QueuePolicy": {"Queues", "PolicyDocument"},
    "AWS::SNS::Topic": {
        "TopicName",
        "Subscription",
        "DisplayName",
        "KmsMasterKeyId",
        "FifoTopic",
        "ContentBasedDeduplication",
        "SignatureVersion",
    },
    "AWS::SNS::TopicPolicy": {"Topics", "PolicyDocument"},
    "AWS::SNS::Subscription": {
        "TopicArn",
        "Protocol",
        "Endpoint",
        "RawMessageDelivery",
        "FilterPolicy",
        "FilterPolicyScope",
        "RedrivePolicy",
        "DeliveryPolicy",
        "Region",
    },
    "AWS::DynamoDB::Table": {
        "TableName",
        "AttributeDefinitions",
        "KeySchema",
        "BillingMode",
        "ProvisionedThroughput",
        "GlobalSecondaryIndexes",
        "LocalSecondaryIndexes",
        "StreamSpecification",
        "SSESpecification",
        "TimeToLiveSpecification",
        "PointInTimeRecoverySpecification",
    },
    "AWS::KMS::Key": {"Description", "KeyUsage", "KeySpec", "EnableKeyRotation"},
    "AWS::SecretsManager::Secret": {"Name", "Description", "SecretString", "GenerateSecretString"},
    "AWS::SSM::Parameter": {"Name", "Description", "Type", "Value"},
    "AWS::Logs::LogGroup": {"LogGroupName", "RetentionInDays"},
    "AWS::ApiGateway::RestApi": {"Name", "Description"},
    "AWS::ApiGateway::ApiKey": {"Name", "Value", "Enabled", "Description"},
    "AWS::ApiGateway::UsagePlan": {"UsagePlanName", "Description", "Throttle", "Quota", "ApiStages"},
    "AWS::ApiGateway::UsagePlanKey": {"UsagePlanId", "KeyId", "KeyType"},
    "AWS::ECS::Cluster": {"ClusterName", "ClusterSettings", "Tags"},
    "AWS::ECS::TaskDefinition": {"Family", *_TASK_DEFINITION_REQUEST},
    "AWS::ECS::Service": {
        "Cluster",
        "ServiceName",
        "TaskDefinition",
        "DesiredCount",
        "SchedulingStrategy",
        "LaunchType",
        "PlatformVersion",
        "PropagateTags",
    },
    **{
        kind: {"ServiceToken", fleet_deploy_steps.PROP_CLUSTER, fleet_deploy_steps.PROP_SERVICE, "TaskDefinition"}
        for kind in (fleet_deploy_steps.DESIRED_COUNT, fleet_deploy_steps.TASK_PROTECTION_RELEASE)
    },
    fleet_deploy_steps.INSTANCE_PROTECTION_RELEASE: {"ServiceToken", fleet_deploy_steps.PROP_GROUP},
}


def deployable(assembly: Assembly) -> None:
    """Raise TemplateError naming every resource type or property the local runtime would silently drop."""
    problems = []
    for logical_id, resource in assembly.resources.items():
        resource_type = resource["Type"]
        if resource_type not in RESOURCE_TYPES:
            problems.append(f"{logical_id}: resource type {resource_type} is neither deployed, emulated nor skipped")
            continue
        if RESOURCE_TYPES[resource_type][0] != "deploy":
            continue
        for name in resource.get("Properties", {}):
            if (
                name not in APPLIED_PROPERTIES.get(resource_type, set())
                and (resource_type, name) not in SKIPPED_PROPERTIES
            ):
                problems.append(f"{logical_id}: property {resource_type}.{name} is neither applied nor skipped")
    if problems:
        raise TemplateError("the local runtime cannot deploy this template as it is:\n  " + "\n  ".join(problems))
