"""cdk/keep_alive.py in the synthesized stack: the function, its schedule, its permissions and its environment."""

from __future__ import annotations

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_sqs as sqs

from async_inference import settings
from async_inference.keep_alive import (
    ENV_KEEP_ALIVE_POLICY,
    ENV_KEEP_ALIVE_QUEUES,
    ENV_KEEP_ALIVE_SERVICE,
)
from cdk.queue_scaling import QueueScaling


def keep_alive_function(template: dict) -> tuple[str, dict]:
    [(function_id, function)] = [
        (k, r)
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
        and ENV_KEEP_ALIVE_POLICY in r["Properties"].get("Environment", {}).get("Variables", {})
    ]
    return function_id, function


def statements(template: dict, function: dict) -> list[dict]:
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return [
        statement
        for policy in template["Resources"].values()
        if policy["Type"] == "AWS::IAM::Policy" and {"Ref": role} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_the_decision_runs_every_minute(stack_template):
    # GIVEN the stack WHEN its schedules are read THEN one rule runs the keep-alive function every minute
    function_id, _ = keep_alive_function(stack_template)
    rules = [
        r["Properties"]["ScheduleExpression"]
        for r in stack_template["Resources"].values()
        if r["Type"] == "AWS::Events::Rule"
        and any(t["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]} for t in r["Properties"].get("Targets", []))
    ]
    assert rules == ["rate(1 minute)"]


def test_the_function_may_publish_only_into_the_services_namespace(stack_template):
    # GIVEN the keep-alive function's role WHEN read THEN it may read metrics and put metric data only into the
    # service's namespace, and nothing else beyond tracing
    _, function = keep_alive_function(stack_template)
    granted = {
        action: statement.get("Condition")
        for statement in statements(stack_template, function)
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
    }
    assert granted.pop("cloudwatch:PutMetricData") == {
        "StringEquals": {"cloudwatch:namespace": settings.METRICS_NAMESPACE}
    }
    assert set(granted) == {"cloudwatch:GetMetricData", "xray:PutTraceSegments", "xray:PutTelemetryRecords"}


def test_the_function_knows_the_counted_queues_at_their_weights_and_the_service(stack_template):
    # GIVEN the keep-alive function's environment WHEN read THEN both counted queues (the batch lane's at its chunk's
    # weight) and the worker service by its fixed name (no reference: the function need not wait for the service)
    _, function = keep_alive_function(stack_template)
    variables = function["Properties"]["Environment"]["Variables"]
    parts = variables[ENV_KEEP_ALIVE_QUEUES]["Fn::Join"][1]
    assert [p["Fn::GetAtt"][1] for p in parts if isinstance(p, dict)] == ["QueueName", "QueueName"]
    assert f",{settings.BATCH_CHUNK_LINES}]]" in parts[-1]
    [service] = [r for r in stack_template["Resources"].values() if r["Type"] == "AWS::ECS::Service"]
    assert variables[ENV_KEEP_ALIVE_SERVICE] == service["Properties"]["ServiceName"]


def test_queue_scaling_without_the_functions_code_refuses_the_learned_keep_alive():
    # GIVEN a bare stack without the service's functions' code WHEN QueueScaling is built with the learned keep-alive
    # THEN a ValueError names what to pass (the code, or learned_keep_alive=False)
    stack = Stack(App(), "Bare")
    cluster = ecs.Cluster(stack, "Cluster")
    cluster.add_capacity("Capacity", instance_type=ec2.InstanceType("g5.xlarge"))
    task = ecs.Ec2TaskDefinition(stack, "Task")
    task.add_container("worker", image=ecs.ContainerImage.from_registry("worker"), memory_reservation_mib=256)
    service = ecs.Ec2Service(stack, "Service", cluster=cluster, task_definition=task)
    with pytest.raises(ValueError, match="pass code=, or learned_keep_alive=False"):
        QueueScaling(stack, "Scaling", service=service, queues=[sqs.Queue(stack, "Jobs")], jobs_per_task=16)
