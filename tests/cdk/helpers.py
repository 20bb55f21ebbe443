"""Small readers over a synthesized template, for the CDK tests."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Template


def role_actions(template: Template, role_logical_id: str) -> dict[str, list[Any]]:
    """action -> resources, over every AWS::IAM::Policy attached to the role."""
    actions: dict[str, list[Any]] = {}
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": role_logical_id} not in policy["Properties"].get("Roles", []):
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            names = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for name in names:
                actions.setdefault(name, []).extend(resources)
    return actions


def function_role(template: Template, handler: str) -> str:
    """Logical id of the execution role of the function with ``handler``."""
    for function in template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}}).values():
        return function["Properties"]["Role"]["Fn::GetAtt"][0]
    raise AssertionError(f"no function with handler {handler}")


def policy_of(template: Template, resource_type: str, logical_id: str) -> list[dict[str, Any]]:
    """Statements of the resource policy (bucket, queue or topic policy) that targets ``logical_id``."""
    statements = []
    for policy in template.find_resources(resource_type).values():
        if logical_id in json.dumps(policy["Properties"]):
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return statements


def denies_insecure_transport(statements: list[dict[str, Any]]) -> bool:
    return any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
    )
