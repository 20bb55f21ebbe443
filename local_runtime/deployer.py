"""Deploys a synthesized template into moto server, resource by resource, the way CloudFormation would.

moto's own CloudFormation (``create_stack``) rejects this template (a MalformedPolicyDocument, and resource types it
cannot create), so this is a small deployer over the template JSON: resources in dependency order, intrinsics
resolved by ``local_runtime.template.Resolver``, and one table, ``RESOURCE_TYPES``, saying for every resource type
what happens to it here:

* ``deploy``: created in moto with the properties the template gives (each handler names the properties it
  applies; ``SKIPPED_PROPERTIES`` lists the ones it does not, with the reason);
* ``emulate``: run by the local runtime itself from the template (functions, their event sources, the REST API, the
  WebSocket API, the worker's task definition): recorded here with the values a Ref or Fn::GetAtt of it gives;
* ``skip``: cannot run here (VPC, Auto Scaling, alarms, IAM...), with the reason and the template test that checks it
  instead.

The worker's ECS cluster, task definition and service are deployed (moto holds them and answers DescribeServices and
UpdateService, which the API's wake from zero calls); moto places no tasks, so the workers themselves run as local
processes from the task definition (``local_runtime.workers``).

A template with a resource type or a property in none of these fails the deploy (and
``tests/local/test_deployer_coverage.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from async_inference import fleet_deploy_steps
from local_runtime.template import LOCAL_ACCOUNT, LOCAL_REGION, Assembly, Resolver, TemplateError, deployment_order

if TYPE_CHECKING:
    from local_runtime.deletion import Deletion

logger = logging.getLogger("local_runtime.deployer")


@dataclass
class Physical:
    """A deployed (or emulated) resource: what Ref gives, its attributes for Fn::GetAtt, its resolved properties."""

    logical_id: str
    type: str
    ref: Any
    attributes: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Skipped:
    """Why a resource type cannot run locally, and the test that checks it on the template instead."""

    reason: str
    checked_by: str  # "tests/...py::test_name"


Handler = Callable[["Deployment", str, dict[str, Any]], Physical]


def _physical_name(stack: str, logical_id: str, *, limit: int = 80, lower: bool = False) -> str:
    """A name in CloudFormation's style (stack-logicalid-suffix), stable for a given stack and logical id."""
    suffix = hashlib.sha1(f"{stack}/{logical_id}".encode()).hexdigest()[:12].upper()
    name = f"{stack}-{logical_id}"[: limit - len(suffix) - 1] + "-" + suffix
    return name.lower() if lower else name


def _arn(service: str, resource: str, *, region: str = LOCAL_REGION, account: str = LOCAL_ACCOUNT) -> str:
    return f"arn:aws:{service}:{region}:{account}:{resource}"


class Deployment:
    """The resources of one template, deployed into the moto server that ``clients`` talk to."""

    def __init__(self, assembly: Assembly, clients: Callable[[str], Any], *, api_key_values: Mapping[str, str]) -> None:
        self.assembly = assembly
        self.stack_name = assembly.stack_name
        self._client = clients
        # API key name (the tenant) -> the value the key gets here; in AWS, API Gateway generates it at deploy.
        self.api_key_values = dict(api_key_values)
        self.resources: dict[str, Physical] = {}
        self.resolver = Resolver(assembly.template, self._ref, self._get_att)
        # Lambda functions that something invokes asynchronously (S3 notifications, SNS): logical id -> the local
        # queue standing in for Lambda's internal event queue.
        self.async_event_queues: dict[str, str] = {}
        self.outputs: dict[str, Any] = {}

    # --- the deploy -------------------------------------------------------------------------------------------------

    def deploy(self) -> Deployment:
        template_resources = self.assembly.resources
        unknown = sorted({r["Type"] for r in template_resources.values()} - set(RESOURCE_TYPES))
        if unknown:
            raise TemplateError(
                "resource types neither deployed, emulated nor listed as skipped in local_runtime.deployer: "
                + ", ".join(unknown)
            )
        for logical_id in deployment_order(template_resources):
            resource = template_resources[logical_id]
            if "Condition" in resource and not self.resolver.condition(resource["Condition"]):
                continue
            kind, handler = RESOURCE_TYPES[resource["Type"]]
            if kind == "skip":
                self.resources[logical_id] = _placeholder(self, logical_id, resource["Type"])
                continue
            properties = self.resolver(resource.get("Properties", {}))
            physical = handler(self, logical_id, properties)
            physical.properties = properties
            self.resources[logical_id] = physical
        self.outputs = {
            name: self.resolver(output["Value"]) for name, output in self.assembly.template.get("Outputs", {}).items()
        }
        return self

    def delete(self) -> Deletion:
        """Delete the stack as CloudFormation would: reverse dependency order, deletion policies honoured
        (``local_runtime.deletion``)."""
        from local_runtime.deletion import delete_stack  # it imports this module's table

        return delete_stack(self)

    def client(self, service: str) -> Any:
        return self._client(service)

    def name_for(self, logical_id: str, *, limit: int = 80, lower: bool = False) -> str:
        return _physical_name(self.stack_name, logical_id, limit=limit, lower=lower)

    def of_type(self, resource_type: str) -> dict[str, Physical]:
        return {lid: p for lid, p in self.resources.items() if p.type == resource_type}

    def has_ref(self, resource_type: str, ref: Any) -> bool:
        """Whether a deployed resource of ``resource_type`` has ``ref`` as its Ref or an attribute."""
        return any(p.ref == ref or ref in p.attributes.values() for p in self.of_type(resource_type).values())

    def by_ref(self, resource_type: str, ref: Any) -> Physical:
        for physical in self.of_type(resource_type).values():
            if physical.ref == ref or ref in physical.attributes.values():
                return physical
        raise TemplateError(f"no {resource_type} deployed with id {ref!r}")

    def _ref(self, logical_id: str) -> Any:
        if logical_id not in self.resources:
            raise TemplateError(f"Ref to {logical_id}, which is not deployed (yet)")
        return self.resources[logical_id].ref

    def _get_att(self, logical_id: str, attribute: str) -> Any:
        physical = self.resources.get(logical_id)
        if physical is None:
            raise TemplateError(f"Fn::GetAtt of {logical_id}, which is not deployed (yet)")
        if attribute not in physical.attributes:
            raise TemplateError(f"Fn::GetAtt {logical_id}.{attribute}: not an attribute the local {physical.type} has")
        return physical.attributes[attribute]

    def async_event_queue(self, function_logical_id: str) -> str:
        """The local queue that stands in for Lambda's event queue of an asynchronously invoked function."""
        if function_logical_id not in self.async_event_queues:
            name = self.name_for(f"{function_logical_id}AsyncEvents")
            url = self.client("sqs").create_queue(QueueName=name)["QueueUrl"]
            self.async_event_queues[function_logical_id] = url
        return self.async_event_queues[function_logical_id]

    def function_by_arn(self, arn: str) -> str:
        """Logical id of the function with this ARN (or name)."""
        for logical_id, physical in self.of_type("AWS::Lambda::Function").items():
            if arn in (physical.ref, physical.attributes["Arn"]):
                return logical_id
        raise TemplateError(f"no function {arn!r} in the template")


def _placeholder(deployment: Deployment, logical_id: str, resource_type: str) -> Physical:
    """A resource that does not run here still answers Ref and Fn::GetAtt, so that what refers to it resolves (an IAM
    role's ARN in a function's properties, a cluster's name in the worker's environment)."""
    service = resource_type.split("::")[1].lower()
    name = deployment.name_for(logical_id)
    arn = _arn(service, f"{logical_id.lower()}/{name}")
    return Physical(logical_id, resource_type, ref=name, attributes=_AnyAttribute(arn=arn, name=name))


class _AnyAttribute(dict):
    """Attributes of a placeholder: Arn-like names give its ARN, anything else its name."""

    def __init__(self, *, arn: str, name: str) -> None:
        super().__init__(Arn=arn)
        self._name = name

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return self["Arn"] if key.endswith("Arn") else self._name


# --- S3 -------------------------------------------------------------------------------------------------------------


def _bucket(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    s3 = d.client("s3")
    name = props.get("BucketName") or d.name_for(logical_id, limit=63, lower=True)
    s3.create_bucket(Bucket=name)
    if "VersioningConfiguration" in props:
        s3.put_bucket_versioning(
            Bucket=name, VersioningConfiguration={"Status": props["VersioningConfiguration"]["Status"]}
        )
    if "BucketEncryption" in props:
        rules = [
            {
                "ApplyServerSideEncryptionByDefault": {
                    k: v
                    for k, v in rule["ServerSideEncryptionByDefault"].items()
                    if k in ("SSEAlgorithm", "KMSMasterKeyID")
                },
                **({"BucketKeyEnabled": rule["BucketKeyEnabled"]} if "BucketKeyEnabled" in rule else {}),
            }
            for rule in props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        ]
        s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration={"Rules": rules})
    if "LifecycleConfiguration" in props:
        s3.put_bucket_lifecycle_configuration(
            Bucket=name,
            LifecycleConfiguration={"Rules": [_lifecycle_rule(r) for r in props["LifecycleConfiguration"]["Rules"]]},
        )
    if "CorsConfiguration" in props:
        s3.put_bucket_cors(
            Bucket=name,
            CORSConfiguration={"CORSRules": [_cors_rule(r) for r in props["CorsConfiguration"]["CorsRules"]]},
        )
    if "PublicAccessBlockConfiguration" in props:
        s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=props["PublicAccessBlockConfiguration"])
    if "OwnershipControls" in props:
        s3.put_bucket_ownership_controls(Bucket=name, OwnershipControls=props["OwnershipControls"])
    if "NotificationConfiguration" in props:
        _apply_notifications(d, name, props["NotificationConfiguration"])
    if "Tags" in props:
        s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": props["Tags"]})
    return Physical(
        logical_id,
        "AWS::S3::Bucket",
        ref=name,
        attributes={
            "Arn": f"arn:aws:s3:::{name}",
            "DomainName": f"{name}.s3.amazonaws.com",
            "RegionalDomainName": f"{name}.s3.{LOCAL_REGION}.amazonaws.com",
            "DualStackDomainName": f"{name}.s3.dualstack.{LOCAL_REGION}.amazonaws.com",
            "WebsiteURL": f"http://{name}.s3-website-{LOCAL_REGION}.amazonaws.com",
        },
    )


def _lifecycle_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """An AWS::S3::Bucket lifecycle rule (CloudFormation's shape) as PutBucketLifecycleConfiguration takes it."""
    out: dict[str, Any] = {
        "ID": rule.get("Id", ""),
        "Status": rule["Status"],
        "Filter": {"Prefix": rule.get("Prefix", "")},
    }
    expiration = {}
    if "ExpirationInDays" in rule:
        expiration["Days"] = rule["ExpirationInDays"]
    if "ExpirationDate" in rule:
        expiration["Date"] = rule["ExpirationDate"]
    if "ExpiredObjectDeleteMarker" in rule:
        expiration["ExpiredObjectDeleteMarker"] = rule["ExpiredObjectDeleteMarker"]
    if expiration:
        out["Expiration"] = expiration
    if "NoncurrentVersionExpiration" in rule:
        out["NoncurrentVersionExpiration"] = {"NoncurrentDays": rule["NoncurrentVersionExpiration"]["NoncurrentDays"]}
    elif "NoncurrentVersionExpirationInDays" in rule:
        out["NoncurrentVersionExpiration"] = {"NoncurrentDays": rule["NoncurrentVersionExpirationInDays"]}
    if "AbortIncompleteMultipartUpload" in rule:
        out["AbortIncompleteMultipartUpload"] = rule["AbortIncompleteMultipartUpload"]
    return out


def _cors_rule(rule: dict[str, Any]) -> dict[str, Any]:
    renames = {
        "AllowedHeaders": "AllowedHeaders",
        "AllowedMethods": "AllowedMethods",
        "AllowedOrigins": "AllowedOrigins",
        "ExposedHeaders": "ExposeHeaders",
        "MaxAge": "MaxAgeSeconds",
        "Id": "ID",
    }
    return {renames[k]: v for k, v in rule.items() if k in renames}


def _apply_notifications(d: Deployment, bucket: str, configuration: dict[str, Any]) -> None:
    """A bucket's notification configuration; a Lambda destination becomes the function's local event queue (moto
    can notify SQS, not run a Python function), which the local runtime invokes the function from, as Lambda's
    asynchronous invocation does."""
    config: dict[str, Any] = {}
    for kind in ("QueueConfigurations", "TopicConfigurations"):
        if configuration.get(kind):
            config[kind] = configuration[kind]
    for entry in configuration.get("LambdaFunctionConfigurations", []):
        function = d.function_by_arn(entry["LambdaFunctionArn"])
        queue_url = d.async_event_queue(function)
        queue_arn = d.client("sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        queue_entry = {"QueueArn": queue_arn, "Events": entry["Events"]}
        if "Filter" in entry:
            queue_entry["Filter"] = entry["Filter"]
        config.setdefault("QueueConfigurations", []).append(queue_entry)
    d.client("s3").put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration=config)


def _bucket_notifications(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    """CDK's Custom::S3BucketNotifications: what its handler does at deploy (PutBucketNotificationConfiguration)."""
    _apply_notifications(d, props["BucketName"], props["NotificationConfiguration"])
    return Physical(logical_id, "Custom::S3BucketNotifications", ref=f"{props['BucketName']}-notifications")


# --- SQS, SNS -------------------------------------------------------------------------------------------------------

_QUEUE_ATTRIBUTES = (
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
    "FifoQueue",
    "ContentBasedDeduplication",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    "DeduplicationScope",
    "FifoThroughputLimit",
)


def _queue(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("QueueName") or d.name_for(logical_id, limit=75 if props.get("FifoQueue") else 80)
    if props.get("FifoQueue") and not name.endswith(".fifo"):
        name += ".fifo"
    attributes = {k: _attribute(props[k]) for k in _QUEUE_ATTRIBUTES if k in props}
    for policy in ("RedrivePolicy", "RedriveAllowPolicy"):
        if policy in props:
            attributes[policy] = json.dumps(props[policy])
    sqs = d.client("sqs")
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return Physical(logical_id, "AWS::SQS::Queue", ref=url, attributes={"Arn": arn, "QueueName": name, "QueueUrl": url})


def _attribute(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _queue_policy(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    for url in props["Queues"]:
        d.client("sqs").set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(props["PolicyDocument"])})
    return Physical(logical_id, "AWS::SQS::QueuePolicy", ref=d.name_for(logical_id))


def _topic(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("TopicName") or d.name_for(logical_id, limit=251 if props.get("FifoTopic") else 256)
    attributes = {
        k: _attribute(props[k])
        for k in ("DisplayName", "KmsMasterKeyId", "FifoTopic", "ContentBasedDeduplication", "SignatureVersion")
        if k in props
    }
    arn = d.client("sns").create_topic(Name=name, Attributes=attributes)["TopicArn"]
    for subscription in props.get("Subscription", []):
        _subscribe(d, f"{logical_id}Inline", {"TopicArn": arn, **subscription})
    return Physical(logical_id, "AWS::SNS::Topic", ref=arn, attributes={"TopicArn": arn, "TopicName": name})


def _topic_policy(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    for arn in props["Topics"]:
        d.client("sns").set_topic_attributes(
            TopicArn=arn, AttributeName="Policy", AttributeValue=json.dumps(props["PolicyDocument"])
        )
    return Physical(logical_id, "AWS::SNS::TopicPolicy", ref=d.name_for(logical_id))


# Subscription protocols that cannot be delivered here, and why.
SKIPPED_SUBSCRIPTION_PROTOCOLS = {
    "email": "no mail is sent locally; the subscription and its filter policy are checked on the template "
    "(tests/cdk/test_notifications.py)",
    "email-json": "as email",
    "https": "moto would call the endpoint over the network and auto-confirms it; checked on the template "
    "(tests/cdk/test_notifications.py)",
    "http": "as https",
}


def _subscribe(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    protocol, endpoint = props["Protocol"], props["Endpoint"]
    attributes = {}
    if "RawMessageDelivery" in props:
        attributes["RawMessageDelivery"] = _attribute(props["RawMessageDelivery"])
    for name in ("FilterPolicy", "RedrivePolicy", "DeliveryPolicy"):
        if name in props:
            attributes[name] = json.dumps(props[name])
    if "FilterPolicyScope" in props:
        attributes["FilterPolicyScope"] = props["FilterPolicyScope"]
    sns = d.client("sns")
    if protocol == "lambda":
        # moto cannot run the function: the topic delivers to the function's local event queue instead, and the
        # local runtime invokes the function with the SNS event Lambda would send.
        queue_url = d.async_event_queue(d.function_by_arn(endpoint))
        endpoint = d.client("sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        protocol = "sqs"
        attributes.pop("RawMessageDelivery", None)
    elif protocol in SKIPPED_SUBSCRIPTION_PROTOCOLS:
        logger.info(
            "subscription %s (%s) not delivered locally: %s",
            logical_id,
            protocol,
            SKIPPED_SUBSCRIPTION_PROTOCOLS[protocol],
        )
        return Physical(logical_id, "AWS::SNS::Subscription", ref=_arn("sns", f"skipped:{logical_id}"))
    elif protocol == "sqs" and not _is_local_queue(d, endpoint):
        logger.info("subscription %s: queue %s belongs to another account; not delivered locally", logical_id, endpoint)
        return Physical(logical_id, "AWS::SNS::Subscription", ref=_arn("sns", f"skipped:{logical_id}"))
    arn = sns.subscribe(
        TopicArn=props["TopicArn"],
        Protocol=protocol,
        Endpoint=endpoint,
        Attributes=attributes,
        ReturnSubscriptionArn=True,
    )["SubscriptionArn"]
    return Physical(logical_id, "AWS::SNS::Subscription", ref=arn, attributes={"Arn": arn})


def _is_local_queue(d: Deployment, arn: str) -> bool:
    return any(p.attributes.get("Arn") == arn for p in d.of_type("AWS::SQS::Queue").values())


# --- DynamoDB -------------------------------------------------------------------------------------------------------


def _table(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("TableName") or d.name_for(logical_id, limit=255)
    request: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props.get("BillingMode", "PROVISIONED"),
    }
    if request["BillingMode"] == "PROVISIONED":
        request["ProvisionedThroughput"] = props["ProvisionedThroughput"]
    for index_kind in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
        if props.get(index_kind):
            request[index_kind] = props[index_kind]
    if "StreamSpecification" in props:
        request["StreamSpecification"] = {"StreamEnabled": True, **props["StreamSpecification"]}
    if "SSESpecification" in props:
        sse = props["SSESpecification"]
        request["SSESpecification"] = {
            "Enabled": sse.get("SSEEnabled", False),
            **({"SSEType": sse["SSEType"]} if "SSEType" in sse else {}),
        }
    dynamodb = d.client("dynamodb")
    description = dynamodb.create_table(**request)["TableDescription"]
    if "TimeToLiveSpecification" in props:
        dynamodb.update_time_to_live(TableName=name, TimeToLiveSpecification=props["TimeToLiveSpecification"])
    if "PointInTimeRecoverySpecification" in props:
        dynamodb.update_continuous_backups(
            TableName=name, PointInTimeRecoverySpecification=props["PointInTimeRecoverySpecification"]
        )
    attributes = {"Arn": description["TableArn"]}
    if "LatestStreamArn" in description:
        attributes["StreamArn"] = description["LatestStreamArn"]
    return Physical(logical_id, "AWS::DynamoDB::Table", ref=name, attributes=attributes)


# --- KMS, Secrets Manager, Logs -------------------------------------------------------------------------------------


def _key(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    kms = d.client("kms")
    request = {k: props[k] for k in ("Description", "KeyUsage", "KeySpec") if k in props}
    metadata = kms.create_key(**request)["KeyMetadata"]
    if props.get("EnableKeyRotation"):
        kms.enable_key_rotation(KeyId=metadata["KeyId"])
    return Physical(
        logical_id,
        "AWS::KMS::Key",
        ref=metadata["KeyId"],
        attributes={"Arn": metadata["Arn"], "KeyId": metadata["KeyId"]},
    )


def _secret(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("Name") or d.name_for(logical_id, limit=512)
    request: dict[str, Any] = {"Name": name}
    if "Description" in props:
        request["Description"] = props["Description"]
    if "SecretString" in props:
        request["SecretString"] = props["SecretString"]
    elif "GenerateSecretString" in props:
        request["SecretString"] = _generate_secret(props["GenerateSecretString"])
    arn = d.client("secretsmanager").create_secret(**request)["ARN"]
    return Physical(logical_id, "AWS::SecretsManager::Secret", ref=arn, attributes={"Id": arn})


def _parameter(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    """An ``AWS::SSM::Parameter`` (the deployment's catalog, cdk/catalog.py): its Ref is its name."""
    name = props.get("Name") or f"/{d.name_for(logical_id)}"
    request = {"Name": name, "Value": props["Value"], "Type": props["Type"]}
    if "Description" in props:
        request["Description"] = props["Description"]
    d.client("ssm").put_parameter(**request)
    attributes = {"Type": props["Type"], "Value": props["Value"]}
    return Physical(logical_id, "AWS::SSM::Parameter", ref=name, attributes=attributes)


def _generate_secret(spec: dict[str, Any]) -> str:
    """What GenerateSecretString gives: a random password, alone or as one key of the JSON template."""
    alphabet = string.ascii_letters + string.digits + ("" if spec.get("ExcludePunctuation") else "!#$%&*+-=?@^_")
    alphabet = "".join(c for c in alphabet if c not in spec.get("ExcludeCharacters", ""))
    password = "".join(secrets.choice(alphabet) for _ in range(int(spec.get("PasswordLength", 32))))
    if "SecretStringTemplate" in spec:
        document = json.loads(spec["SecretStringTemplate"])
        document[spec["GenerateStringKey"]] = password
        return json.dumps(document)
    return password


def _log_group(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("LogGroupName") or d.name_for(logical_id, limit=512)
    logs = d.client("logs")
    logs.create_log_group(logGroupName=name)
    if "RetentionInDays" in props:
        logs.put_retention_policy(logGroupName=name, retentionInDays=int(props["RetentionInDays"]))
    return Physical(
        logical_id, "AWS::Logs::LogGroup", ref=name, attributes={"Arn": _arn("logs", f"log-group:{name}:*")}
    )


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
    arn = _arn("lambda", f"function:{name}")
    return Physical(logical_id, "AWS::Lambda::Function", ref=name, attributes={"Arn": arn})


def _layer(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("LayerName") or d.name_for(logical_id, limit=64)
    return Physical(logical_id, "AWS::Lambda::LayerVersion", ref=_arn("lambda", f"layer:{name}:1"))


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

_WORKERS_TEST = "tests/cdk/test_workers_and_scaling.py"
_API_TEST = "tests/cdk/test_api_and_permissions.py"
_STORAGE_TEST = "tests/cdk/test_storage_and_messaging.py"
_NOTIFY_TEST = "tests/cdk/test_notifications.py"


def _skip(reason: str, checked_by: str) -> tuple[str, Skipped]:
    return "skip", Skipped(reason, checked_by)


RESOURCE_TYPES: dict[str, tuple[str, Handler | Skipped | None]] = {
    # deployed into moto
    "AWS::S3::Bucket": ("deploy", _bucket),
    "Custom::S3BucketNotifications": ("deploy", _bucket_notifications),
    "AWS::SQS::Queue": ("deploy", _queue),
    "AWS::SQS::QueuePolicy": ("deploy", _queue_policy),
    "AWS::SNS::Topic": ("deploy", _topic),
    "AWS::SNS::TopicPolicy": ("deploy", _topic_policy),
    "AWS::SNS::Subscription": ("deploy", _subscribe),
    "AWS::DynamoDB::Table": ("deploy", _table),
    "AWS::KMS::Key": ("deploy", _key),
    "AWS::SecretsManager::Secret": ("deploy", _secret),
    "AWS::SSM::Parameter": ("deploy", _parameter),
    "AWS::Logs::LogGroup": ("deploy", _log_group),
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
    # cannot run here: what checks each instead
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
    "AWS::SQS::Queue": {"QueueName", "RedrivePolicy", "RedriveAllowPolicy", *_QUEUE_ATTRIBUTES},
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
