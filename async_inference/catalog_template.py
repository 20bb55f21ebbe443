"""The deployment's catalog as a synthesized template holds it: what each function reads from it at start, rendered as
the environment variables it makes (``async_inference.config.catalog_variables``), references still unresolved.

A function reads the parts of the catalog its role may ``ssm:GetParametersByPath`` (``cdk.catalog``); each part is
the template's ``AWS::SSM::Parameter`` resources under the catalog's path. A value that holds references is rendered
as CloudFormation would join it (``{"Fn::Join": ["", [...]]}``, adjacent literals merged), so a reader of the
template (a test, the scaling simulator) sees the variable as it once was in the environment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from async_inference import catalog
from async_inference.config import CATALOG_VARIABLES, catalog_value

# A reference's place in a parameter's text while it is read as JSON (a literal no entry holds).
_MARK = "@@reference-{}@@"
_MARKS = re.compile(r"@@reference-(\d+)@@")


def _parts(value: Any) -> list[Any]:
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        assert separator == "", value
        return list(parts)
    return [value]


def _render(value: Any, tokens: list[Any]) -> Any:
    """``value`` (holding marks of ``tokens``) as compact JSON: a string, or a Fn::Join of literals and references."""
    text = json.dumps(value, separators=(",", ":"))
    pieces = _MARKS.split(text)
    parts: list[Any] = []
    for index, piece in enumerate(pieces):
        if index % 2:
            parts.append(tokens[int(piece)])
        elif piece:
            if parts and isinstance(parts[-1], str):
                parts[-1] += piece
            else:
                parts.append(piece)
    return parts[0] if len(parts) == 1 and isinstance(parts[0], str) else {"Fn::Join": ["", parts]}


def _entries(template: Mapping[str, Any], part: catalog.Part, tokens: list[Any]) -> dict[str, dict[str, Any]]:
    """``part``'s entries by name, each reference replaced by a mark of its index in ``tokens``."""
    entries: dict[str, dict[str, Any]] = {}
    for resource in template.get("Resources", {}).values():
        if resource["Type"] != "AWS::SSM::Parameter":
            continue
        name = resource["Properties"].get("Name")
        if not isinstance(name, str) or f"/catalog/{part}/" not in name:
            continue
        text = ""
        for piece in _parts(resource["Properties"]["Value"]):
            if isinstance(piece, str):
                text += piece
            else:
                tokens.append(piece)
                text += _MARK.format(len(tokens) - 1)
        entry = json.loads(text)
        entries[entry.pop("name")] = entry
    return entries


def readable_parts(template: Mapping[str, Any], function_id: str) -> set[catalog.Part]:
    """The parts of the catalog the function's role may read (ssm:GetParametersByPath on the part's path)."""
    role = template["Resources"][function_id]["Properties"].get("Role", {}).get("Fn::GetAtt", [None])[0]
    parts: set[catalog.Part] = set()
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::IAM::Policy" or {"Ref": role} not in resource["Properties"].get("Roles", []):
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if statement.get("Effect") == "Allow" and "ssm:GetParametersByPath" in actions:
                where = json.dumps(statement["Resource"])
                parts |= {part for part in (catalog.TENANTS, catalog.MODELS) if f"/catalog/{part}" in where}
    return parts


def function_variables(template: Mapping[str, Any], function_id: str) -> dict[str, Any]:
    """The function's environment as the template holds it, plus each variable it reads from the catalog."""
    properties = template["Resources"][function_id]["Properties"]
    variables = dict(properties.get("Environment", {}).get("Variables", {}))
    if catalog.ENV_CATALOG_PATH not in variables:
        return variables
    readable = readable_parts(template, function_id)
    tokens: list[Any] = []
    entries = {part: _entries(template, part, tokens) for part in readable}
    for name, (part, key) in CATALOG_VARIABLES.items():
        if part in readable and name not in variables:
            variables[name] = _render(catalog_value(entries[part], key), tokens)
    return variables
