"""Nested stacks (``AWS::CloudFormation::Stack``), inlined into their parent's template before the local deploy.

CloudFormation deploys a nested stack as one resource of its parent: its own template, its parameters given by the
parent, its outputs read back with ``Fn::GetAtt [Stack, Outputs.<name>]``. Locally the nested template (a file of the
cloud assembly, named in the resource's ``aws:asset:path``) is merged into the parent's: each of its resources,
conditions and outputs under its logical id prefixed with the nested stack's, each ``Ref`` to a parameter replaced
by what the parent passes, each read of an output by the output's value, and each ``DependsOn`` of or on the nested
stack carried to its resources. The result is one template, deployed, run and deleted as any other (a delete takes
the nested resources in reverse dependency order among the parent's, as CloudFormation takes the nested stack as a
whole after what refers to it).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from local_runtime.template import TemplateError

NESTED_STACK = "AWS::CloudFormation::Stack"
_OUTPUTS = "Outputs."


def _depends_on(resource: Mapping[str, Any]) -> list[str]:
    value = resource.get("DependsOn", [])
    return [value] if isinstance(value, str) else list(value)


def _rewrite(value: Any, rewrite: Callable[[dict[str, Any]], Any]) -> Any:
    """``value`` with every dict replaced by ``rewrite(dict)`` where that is not None, bottom up."""
    if isinstance(value, list):
        return [_rewrite(item, rewrite) for item in value]
    if isinstance(value, dict):
        node = {key: _rewrite(item, rewrite) for key, item in value.items()}
        replaced = rewrite(node)
        return node if replaced is None else replaced
    return value


def _sub_names_local(sub: Any, parameters: Mapping[str, Any], resources: Mapping[str, Any]) -> bool:
    """Whether an ``Fn::Sub`` names one of the nested template's parameters or resources (``${Name}``,
    ``${Name.Attribute}``), which inlining would have to rename: its own variables and pseudo parameters are not."""
    text, variables = (sub, {}) if isinstance(sub, str) else (sub[0], sub[1])
    names = {name.split(".")[0] for name in re.findall(r"\$\{([^!}][^}]*)\}", text)}
    return any(name in parameters or name in resources for name in names - set(variables))


def _inline_one(
    directory: Path, stack_id: str, stack: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The nested stack ``stack_id``'s resources, conditions and outputs' values, in the parent's terms."""
    path = stack.get("Metadata", {}).get("aws:asset:path")
    if not path:
        raise TemplateError(f"{stack_id}: a nested stack without its template in the assembly (aws:asset:path)")
    template = inline_nested_stacks(directory, json.loads((directory / path).read_text()))
    given = stack.get("Properties", {}).get("Parameters", {})
    parameters = {}
    for name, declared in template.get("Parameters", {}).items():
        if name in given:
            parameters[name] = given[name]
        elif "Default" in declared:
            parameters[name] = declared["Default"]
        else:
            raise TemplateError(f"{stack_id}: its parameter {name} is given no value")
    resources, conditions = template.get("Resources", {}), template.get("Conditions", {})

    def local(node: dict[str, Any]) -> Any:
        if len(node) != 1:
            return None
        [(key, target)] = node.items()
        if key == "Ref" and target in parameters:
            return copy.deepcopy(parameters[target])
        if key == "Ref" and target in resources:
            return {"Ref": stack_id + target}
        if key == "Fn::GetAtt" and target[0] in resources:
            return {"Fn::GetAtt": [stack_id + target[0], *target[1:]]}
        if key == "Condition" and target in conditions:
            return {"Condition": stack_id + target}
        if key == "Fn::If" and target[0] in conditions:
            return {"Fn::If": [stack_id + target[0], *target[1:]]}
        if key == "Fn::Sub" and not _sub_names_local(target, parameters, resources):
            return None  # pseudo parameters only (the image repository's name): the same in the parent
        if key == "Fn::Sub":
            raise TemplateError(f"{stack_id}: Fn::Sub in a nested stack is not inlined locally: {node}")
        return None

    inlined = {}
    outer = _depends_on(stack)
    for logical_id, resource in resources.items():
        resource = _rewrite(resource, local)
        depends = [stack_id + d for d in _depends_on(resource)] + outer
        if depends:
            resource["DependsOn"] = depends
        if "Condition" in resource:
            resource["Condition"] = stack_id + resource["Condition"]
        inlined[stack_id + logical_id] = resource
    renamed_conditions = {stack_id + name: _rewrite(body, local) for name, body in conditions.items()}
    outputs = {name: _rewrite(output["Value"], local) for name, output in template.get("Outputs", {}).items()}
    return inlined, renamed_conditions, outputs


def inline_nested_stacks(directory: Path, template: dict[str, Any]) -> dict[str, Any]:
    """``template`` (of the assembly in ``directory``) with every nested stack's resources in place of it."""
    nested = {lid: r for lid, r in template.get("Resources", {}).items() if r["Type"] == NESTED_STACK}
    if not nested:
        return template
    resources = {lid: r for lid, r in template["Resources"].items() if lid not in nested}
    conditions = dict(template.get("Conditions", {}))
    members: dict[str, list[str]] = {}
    outputs: dict[str, dict[str, Any]] = {}
    for stack_id, stack in nested.items():
        inlined, stack_conditions, outputs[stack_id] = _inline_one(directory, stack_id, stack)
        resources.update(inlined)
        conditions.update(stack_conditions)
        members[stack_id] = list(inlined)

    def parent(node: dict[str, Any]) -> Any:
        target = node.get("Fn::GetAtt") if len(node) == 1 else None
        if target and target[0] in nested:
            attribute = target[1] if len(target) == 2 else ".".join(target[1:])
            if not attribute.startswith(_OUTPUTS) or attribute[len(_OUTPUTS) :] not in outputs[target[0]]:
                raise TemplateError(f"Fn::GetAtt {target[0]}.{attribute}: not an output of the nested stack")
            return copy.deepcopy(outputs[target[0]][attribute[len(_OUTPUTS) :]])
        if node.get("Ref") in nested and len(node) == 1:
            raise TemplateError(f"Ref to the nested stack {node['Ref']}: its stack id is not given locally")
        return None

    for logical_id, resource in list(resources.items()):
        resource = _rewrite(resource, parent)
        depends = _depends_on(resource)
        if any(d in nested for d in depends):
            resource["DependsOn"] = [m for d in depends for m in (members.get(d) or [d])]
        resources[logical_id] = resource
    result = {**template, "Resources": resources}
    if conditions:
        result["Conditions"] = conditions
    if "Outputs" in template:
        result["Outputs"] = _rewrite(template["Outputs"], parent)
    return result
