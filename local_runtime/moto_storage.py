"""The handlers that deploy storage, messaging and secrets into moto, each from a resource's resolved properties: S3
buckets and their notifications, SQS queues, SNS topics and subscriptions, DynamoDB tables, KMS keys, Secrets
Manager secrets, SSM parameters, log groups (``local_runtime.resource_types`` lists them with what each applies).
"""

from __future__ import annotations

import json
import logging
import secrets
import string
from typing import TYPE_CHECKING, Any

from local_runtime.physical import Physical, arn_of
from local_runtime.template import LOCAL_REGION

if TYPE_CHECKING:
    from local_runtime.deployer import Deployment

logger = logging.getLogger("local_runtime.deployer")


# --- S3 -------------------------------------------------------------------------------------------------------------


def bucket(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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


def bucket_notifications(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    """CDK's Custom::S3BucketNotifications: what its handler does at deploy (PutBucketNotificationConfiguration)."""
    _apply_notifications(d, props["BucketName"], props["NotificationConfiguration"])
    return Physical(logical_id, "Custom::S3BucketNotifications", ref=f"{props['BucketName']}-notifications")


# --- SQS, SNS -------------------------------------------------------------------------------------------------------

QUEUE_ATTRIBUTES = (
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


def queue(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("QueueName") or d.name_for(logical_id, limit=75 if props.get("FifoQueue") else 80)
    if props.get("FifoQueue") and not name.endswith(".fifo"):
        name += ".fifo"
    attributes = {k: _attribute(props[k]) for k in QUEUE_ATTRIBUTES if k in props}
    for policy in ("RedrivePolicy", "RedriveAllowPolicy"):
        if policy in props:
            attributes[policy] = json.dumps(props[policy])
    sqs = d.client("sqs")
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return Physical(logical_id, "AWS::SQS::Queue", ref=url, attributes={"Arn": arn, "QueueName": name, "QueueUrl": url})


def _attribute(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def queue_policy(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    for url in props["Queues"]:
        d.client("sqs").set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(props["PolicyDocument"])})
    return Physical(logical_id, "AWS::SQS::QueuePolicy", ref=d.name_for(logical_id))


def topic(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("TopicName") or d.name_for(logical_id, limit=251 if props.get("FifoTopic") else 256)
    attributes = {
        k: _attribute(props[k])
        for k in ("DisplayName", "KmsMasterKeyId", "FifoTopic", "ContentBasedDeduplication", "SignatureVersion")
        if k in props
    }
    arn = d.client("sns").create_topic(Name=name, Attributes=attributes)["TopicArn"]
    for subscription in props.get("Subscription", []):
        subscribe(d, f"{logical_id}Inline", {"TopicArn": arn, **subscription})
    return Physical(logical_id, "AWS::SNS::Topic", ref=arn, attributes={"TopicArn": arn, "TopicName": name})


def topic_policy(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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


def subscribe(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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
        return Physical(logical_id, "AWS::SNS::Subscription", ref=arn_of("sns", f"skipped:{logical_id}"))
    elif protocol == "sqs" and not _is_local_queue(d, endpoint):
        logger.info("subscription %s: queue %s belongs to another account; not delivered locally", logical_id, endpoint)
        return Physical(logical_id, "AWS::SNS::Subscription", ref=arn_of("sns", f"skipped:{logical_id}"))
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


def table(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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


def key(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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


def secret(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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


def parameter(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
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


def log_group(d: Deployment, logical_id: str, props: dict[str, Any]) -> Physical:
    name = props.get("LogGroupName") or d.name_for(logical_id, limit=512)
    logs = d.client("logs")
    logs.create_log_group(logGroupName=name)
    if "RetentionInDays" in props:
        logs.put_retention_policy(logGroupName=name, retentionInDays=int(props["RetentionInDays"]))
    return Physical(
        logical_id, "AWS::Logs::LogGroup", ref=name, attributes={"Arn": arn_of("logs", f"log-group:{name}:*")}
    )
