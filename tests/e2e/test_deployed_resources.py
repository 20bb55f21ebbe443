"""The local resources carry the template's properties: each is read back from moto and compared with the
synthesized template it was deployed from (what drifted when the local stack was written by hand: the job queue's
retention, the table's TTL, the bucket's versioning)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from local_runtime.stack import LocalDeployment

pytestmark = pytest.mark.e2e


def deployed(stack: LocalDeployment, resource_type: str) -> list[tuple[Any, dict[str, Any]]]:
    """(physical id, resolved template properties) of each deployed resource of a type."""
    assert stack.deployment is not None
    return [(p.ref, p.properties) for p in stack.deployment.of_type(resource_type).values()]


def test_queues_have_the_templates_attributes(stack: LocalDeployment):
    sqs = stack.client("sqs")
    queues = deployed(stack, "AWS::SQS::Queue")
    assert len(queues) >= 4
    for url, props in queues:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        for name in ("VisibilityTimeout", "MessageRetentionPeriod", "ReceiveMessageWaitTimeSeconds", "DelaySeconds"):
            if name in props:
                assert attributes[name] == str(props[name]), (url, name)
        assert attributes.get("SqsManagedSseEnabled") == str(props.get("SqsManagedSseEnabled", False)).lower()
        if "RedrivePolicy" in props:
            redrive = json.loads(attributes["RedrivePolicy"])
            assert redrive["deadLetterTargetArn"] == props["RedrivePolicy"]["deadLetterTargetArn"]
            assert int(redrive["maxReceiveCount"]) == props["RedrivePolicy"]["maxReceiveCount"]
        else:
            assert "RedrivePolicy" not in attributes


def test_the_job_queue_keeps_messages_as_long_as_the_template_says(stack: LocalDeployment):
    # The hand-written local queue kept messages 4 days (SQS's default) while the template says 14.
    assert stack.resources is not None
    attributes = stack.client("sqs").get_queue_attributes(
        QueueUrl=stack.resources.config.queue_url, AttributeNames=["MessageRetentionPeriod"]
    )["Attributes"]
    assert attributes["MessageRetentionPeriod"] == str(14 * 86400)


def test_tables_have_the_templates_keys_indexes_ttl_and_recovery(stack: LocalDeployment):
    dynamodb = stack.client("dynamodb")
    for name, props in deployed(stack, "AWS::DynamoDB::Table"):
        table = dynamodb.describe_table(TableName=name)["Table"]
        assert table["KeySchema"] == props["KeySchema"]
        indexes = {i["IndexName"]: i["KeySchema"] for i in table.get("GlobalSecondaryIndexes", [])}
        assert indexes == {i["IndexName"]: i["KeySchema"] for i in props.get("GlobalSecondaryIndexes", [])}
        ttl = dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        if "TimeToLiveSpecification" in props:
            assert ttl["AttributeName"] == props["TimeToLiveSpecification"]["AttributeName"]
            assert ttl["TimeToLiveStatus"] == "ENABLED"
        backups = dynamodb.describe_continuous_backups(TableName=name)["ContinuousBackupsDescription"]
        expected = props.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled", False)
        recovery = backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"]
        assert (recovery == "ENABLED") == expected


def test_buckets_have_the_templates_versioning_lifecycle_cors_and_notifications(stack: LocalDeployment):
    s3 = stack.client("s3")
    for name, props in deployed(stack, "AWS::S3::Bucket"):
        versioning = s3.get_bucket_versioning(Bucket=name).get("Status")
        assert versioning == props.get("VersioningConfiguration", {}).get("Status"), name
        if "LifecycleConfiguration" in props:
            rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]}
            for rule in props["LifecycleConfiguration"]["Rules"]:
                deployed_rule = rules[rule["Id"]]
                assert deployed_rule["Filter"].get("Prefix", "") == rule.get("Prefix", "")
                if "ExpirationInDays" in rule:
                    assert deployed_rule["Expiration"]["Days"] == rule["ExpirationInDays"]
        if "CorsConfiguration" in props:
            cors = s3.get_bucket_cors(Bucket=name)["CORSRules"]
            assert [r["AllowedMethods"] for r in cors] == [
                r["AllowedMethods"] for r in props["CorsConfiguration"]["CorsRules"]
            ]
    assert stack.resources is not None
    # Each of the template's function notifications is deployed as a queue notification with the same filter (moto's
    # S3 notifies SQS, from which the local runtime invokes the function, as Lambda's asynchronous invocation does)
    notifications = s3.get_bucket_notification_configuration(Bucket=stack.resources.config.bucket_name)
    [(_, template)] = [
        (name, props)
        for name, props in deployed(stack, "Custom::S3BucketNotifications")
        if props["BucketName"] == stack.resources.config.bucket_name
    ]
    filters = [c["Filter"]["Key"]["FilterRules"] for c in notifications["QueueConfigurations"]]
    wanted = [
        c["Filter"]["Key"]["FilterRules"] for c in template["NotificationConfiguration"]["LambdaFunctionConfigurations"]
    ]
    assert sorted(map(_rules, filters)) == sorted(map(_rules, wanted))
    assert [{"Name": "prefix", "Value": "uploads/"}] in filters


def _rules(rules: list[dict[str, str]]) -> list[tuple[str, str]]:
    """A filter's rules in one order (S3 may answer them in another)."""
    return sorted((r["Name"].lower(), r["Value"]) for r in rules)


def test_subscriptions_have_the_templates_filter_policies_and_raw_delivery(stack: LocalDeployment):
    sns = stack.client("sns")
    delivered = [(arn, props) for arn, props in deployed(stack, "AWS::SNS::Subscription") if ":skipped:" not in arn]
    assert delivered
    for arn, props in delivered:
        attributes = sns.get_subscription_attributes(SubscriptionArn=arn)["Attributes"]
        if "FilterPolicy" in props:
            assert json.loads(attributes["FilterPolicy"]) == props["FilterPolicy"]
        assert attributes.get("RawMessageDelivery", "false") == str(props.get("RawMessageDelivery", False)).lower()


def test_api_keys_and_usage_plans_are_the_templates(stack: LocalDeployment):
    apigateway = stack.client("apigateway")
    names = {k["name"] for k in apigateway.get_api_keys()["items"] if k["enabled"]}
    assert names == {props["Name"] for _, props in deployed(stack, "AWS::ApiGateway::ApiKey")}
    plans = {p["name"]: p for p in apigateway.get_usage_plans()["items"]}
    for _, props in deployed(stack, "AWS::ApiGateway::UsagePlan"):
        plan = plans[props["UsagePlanName"]]
        assert plan["throttle"] == {
            "burstLimit": props["Throttle"]["BurstLimit"],
            "rateLimit": props["Throttle"]["RateLimit"],
        }
        assert plan["quota"]["limit"] == props["Quota"]["Limit"]


def test_log_groups_keep_logs_as_long_as_the_template_says(stack: LocalDeployment):
    logs = stack.client("logs")
    for name, props in deployed(stack, "AWS::Logs::LogGroup"):
        (group,) = [
            g for g in logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"] if g["logGroupName"] == name
        ]
        assert group.get("retentionInDays") == props.get("RetentionInDays")
