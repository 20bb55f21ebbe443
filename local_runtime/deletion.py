"""A stack delete, rehearsed against moto the way CloudFormation runs one: every resource after everything that refers
to or depends on it (the deploy order reversed), its ``DeletionPolicy`` honoured.

``DELETERS`` says for every resource type the deployer creates in moto what deleting it calls (the emulated and
skipped types hold nothing in moto). A resource with ``DeletionPolicy`` Retain (or RetainExceptOnCreate: the stack
was created) is left where it is and listed in ``Deletion.retained`` with its ``UpdateReplacePolicy``; what
CloudFormation itself could not delete (a bucket that still holds objects) fails the resource, as it would leave the
stack in DELETE_FAILED, and is listed in ``Deletion.failed``. The GPU fleets' delete steps
(``async_inference.fleet_deploy_steps``) run at their place in the order, as their function would.

docs/deploying.md ("What a delete leaves") lists what stays on purpose and the command that removes each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from async_inference import fleet_deploy_steps
from local_runtime.deployer import Deployment
from local_runtime.physical import Physical
from local_runtime.resource_types import RESOURCE_TYPES
from local_runtime.template import TemplateError, deployment_order

logger = logging.getLogger("local_runtime.deletion")

RETAINING_POLICIES = ("Retain", "RetainExceptOnCreate")
# Deletion policies that keep nothing (Snapshot applies to none of the types the stack deploys).
DELETING_POLICIES = ("Delete",)


@dataclass(frozen=True)
class Retained:
    logical_id: str
    type: str
    physical_id: Any
    deletion_policy: str
    update_replace_policy: str


@dataclass
class Deletion:
    """What a delete did: the logical ids deleted (in order), those retained, those that failed and why."""

    deleted: list[str] = field(default_factory=list)
    retained: list[Retained] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def retained_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for resource in self.retained:
            counts[resource.type] = counts.get(resource.type, 0) + 1
        return counts


class DeleteFailed(Exception):
    """CloudFormation would fail this resource's delete (the stack then stays in DELETE_FAILED)."""


Deleter = Callable[[Deployment, Physical], None]


def delete_stack(deployment: Deployment) -> Deletion:
    """Delete what ``deployment`` deployed, in reverse dependency order, honouring each resource's DeletionPolicy."""
    resources = deployment.assembly.resources
    result = Deletion()
    for logical_id in reversed(deployment_order(resources)):
        physical = deployment.resources.get(logical_id)
        if physical is None:  # its Condition was false: never created
            continue
        resource = resources[logical_id]
        policy = resource.get("DeletionPolicy", "Delete")
        if policy in RETAINING_POLICIES:
            result.retained.append(
                Retained(
                    logical_id,
                    physical.type,
                    physical.ref,
                    policy,
                    resource.get("UpdateReplacePolicy", "Delete"),
                )
            )
            continue
        if policy not in DELETING_POLICIES:
            raise TemplateError(f"{logical_id}: DeletionPolicy {policy} is not rehearsed here")
        kind, _ = RESOURCE_TYPES[physical.type]
        deleter = DELETERS.get(physical.type)
        if kind == "deploy" and deleter is None:
            raise TemplateError(
                f"{logical_id}: {physical.type} is deployed but local_runtime.deletion cannot delete it"
            )
        try:
            if deleter is not None:
                deleter(deployment, physical)
        except DeleteFailed as exc:
            result.failed[logical_id] = str(exc)
            continue
        del deployment.resources[logical_id]
        result.deleted.append(logical_id)
    # The local stand-ins for Lambda's internal event queues go with their functions.
    for url in deployment.async_event_queues.values():
        deployment.client("sqs").delete_queue(QueueUrl=url)
    deployment.async_event_queues.clear()
    return result


def _bucket(d: Deployment, p: Physical) -> None:
    s3 = d.client("s3")
    listed = s3.list_object_versions(Bucket=p.ref, MaxKeys=1)
    if listed.get("Versions") or listed.get("DeleteMarkers"):
        raise DeleteFailed(f"The bucket you tried to delete is not empty: {p.ref}")
    s3.delete_bucket(Bucket=p.ref)


def _bucket_notifications(d: Deployment, p: Physical) -> None:
    # CDK's handler puts the bucket's notifications back to none (the bucket may be retained).
    d.client("s3").put_bucket_notification_configuration(
        Bucket=p.properties["BucketName"], NotificationConfiguration={}
    )


def _subscription(d: Deployment, p: Physical) -> None:
    if ":skipped:" not in p.ref:
        d.client("sns").unsubscribe(SubscriptionArn=p.ref)


def _service(d: Deployment, p: Physical) -> None:
    ecs = d.client("ecs")
    cluster = p.properties["Cluster"]
    ecs.update_service(cluster=cluster, service=p.ref, desiredCount=0)
    ecs.delete_service(cluster=cluster, service=p.ref)


def _usage_plan_key(d: Deployment, p: Physical) -> None:
    plan, key = p.ref.split(":", 1)
    d.client("apigateway").delete_usage_plan_key(usagePlanId=plan, keyId=key)


def _fleet_step(resource_type: str) -> Deleter:
    def delete(d: Deployment, p: Physical) -> None:
        event = {"ResourceType": resource_type, "RequestType": "Delete", "ResourceProperties": p.properties}
        fleet_deploy_steps.handle(event, ecs=d.client("ecs"), autoscaling=d.client("autoscaling"))

    return delete


def _nothing(d: Deployment, p: Physical) -> None:
    """A policy that goes with what it is attached to."""


DELETERS: dict[str, Deleter] = {
    "AWS::S3::Bucket": _bucket,
    "Custom::S3BucketNotifications": _bucket_notifications,
    "AWS::SQS::Queue": lambda d, p: d.client("sqs").delete_queue(QueueUrl=p.ref),
    "AWS::SQS::QueuePolicy": _nothing,
    "AWS::SNS::Topic": lambda d, p: d.client("sns").delete_topic(TopicArn=p.ref),
    "AWS::SNS::TopicPolicy": _nothing,
    "AWS::SNS::Subscription": _subscription,
    "AWS::DynamoDB::Table": lambda d, p: d.client("dynamodb").delete_table(TableName=p.ref),
    # CloudFormation schedules a key's deletion (PendingWindowInDays, 30 by default): it is gone for use at once.
    "AWS::KMS::Key": lambda d, p: d.client("kms").schedule_key_deletion(
        KeyId=p.ref, PendingWindowInDays=int(p.properties.get("PendingWindowInDays", 30))
    ),
    "AWS::SecretsManager::Secret": lambda d, p: d.client("secretsmanager").delete_secret(
        SecretId=p.ref, ForceDeleteWithoutRecovery=True
    ),
    "AWS::SSM::Parameter": lambda d, p: d.client("ssm").delete_parameter(Name=p.ref),
    "AWS::Logs::LogGroup": lambda d, p: d.client("logs").delete_log_group(logGroupName=p.ref),
    "AWS::ApiGateway::RestApi": lambda d, p: d.client("apigateway").delete_rest_api(restApiId=p.ref),
    "AWS::ApiGateway::ApiKey": lambda d, p: d.client("apigateway").delete_api_key(apiKey=p.ref),
    "AWS::ApiGateway::UsagePlan": lambda d, p: d.client("apigateway").delete_usage_plan(usagePlanId=p.ref),
    "AWS::ApiGateway::UsagePlanKey": _usage_plan_key,
    "AWS::ECS::Cluster": lambda d, p: d.client("ecs").delete_cluster(cluster=p.ref),
    "AWS::ECS::TaskDefinition": lambda d, p: d.client("ecs").deregister_task_definition(taskDefinition=p.ref),
    "AWS::ECS::Service": _service,
    **{kind: _fleet_step(kind) for kind in fleet_deploy_steps.RESOURCE_TYPES},
}
