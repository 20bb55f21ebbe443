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


def role_statements(template: Template, role_logical_id: str) -> list[dict[str, Any]]:
    """Every statement of every AWS::IAM::Policy attached to the role."""
    return [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        if {"Ref": role_logical_id} in policy["Properties"].get("Roles", [])
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def _references(value: Any) -> set[str]:
    """Logical ids that ``value`` refers to through Ref and Fn::GetAtt."""
    if isinstance(value, dict):
        found = set()
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str):
                found.add(inner)
            elif key == "Fn::GetAtt":
                found.add(inner[0] if isinstance(inner, list) else inner.split(".")[0])
            else:
                found |= _references(inner)
        return found
    if isinstance(value, list):
        return set().union(*(_references(v) for v in value)) if value else set()
    return set()


def dependency_cycle(template_json: dict[str, Any]) -> list[str] | None:
    """A cycle among the resources (Ref, Fn::GetAtt, DependsOn), as a list of logical ids, or None."""
    resources = template_json["Resources"]
    edges = {}
    for name, resource in resources.items():
        depends = resource.get("DependsOn", [])
        depends = [depends] if isinstance(depends, str) else depends
        edges[name] = (_references(resource.get("Properties", {})) | set(depends)) & set(resources)
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for node in resources:
        if node not in state and (cycle := visit(node, [node])):
            return cycle
    return None


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


def dashboard_widgets(template: Template) -> list[dict[str, Any]]:
    """The widgets of the stack's one dashboard, its body parsed (deploy-time tokens read as the text TOKEN)."""
    [dashboard] = template.find_resources("AWS::CloudWatch::Dashboard").values()
    body = dashboard["Properties"]["DashboardBody"]
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    # Tokens (region, queue names) sit inside JSON strings, so a bare placeholder keeps the text valid JSON.
    return json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))["widgets"]


def dashboard_metrics(template: Template, namespace: str) -> list[tuple[str, dict[str, str], str]]:
    """(metric name, dimensions, statistic) of every metric of ``namespace`` plotted on the dashboard."""
    found = []
    for widget in dashboard_widgets(template):
        for entry in widget.get("properties", {}).get("metrics", []):
            fields, options = (entry[:-1], entry[-1]) if isinstance(entry[-1], dict) else (entry, {})
            if len(fields) >= 2 and fields[0] == namespace:
                dimensions = dict(zip(fields[2::2], fields[3::2], strict=False))
                found.append((fields[1], dimensions, options.get("stat", "Average")))
    return found
