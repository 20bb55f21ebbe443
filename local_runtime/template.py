"""A synthesized cloud assembly (``cdk.out/``) as the local runtime reads it: the stack's template, its assets, and the
CloudFormation intrinsics CDK emits, resolved in one place.

The local runtime deploys this template and nothing else: every queue, table, function environment and the worker's
task definition come from here (see ``local_runtime.deployer``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What CloudFormation answers for its pseudo parameters locally: moto's default account, the local region.
LOCAL_ACCOUNT = "123456789012"
LOCAL_REGION = "us-east-1"
PSEUDO_PARAMETERS = {
    "AWS::AccountId": LOCAL_ACCOUNT,
    "AWS::Region": LOCAL_REGION,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NoValue": None,
}


class TemplateError(ValueError):
    """The template uses something the local runtime cannot resolve; the message names it."""


@dataclass(frozen=True)
class Assembly:
    """One stack of a cloud assembly directory: its template (its nested stacks' resources inlined:
    ``local_runtime.nested``) and where its assets were staged."""

    directory: Path
    stack_name: str
    template: dict[str, Any]

    @classmethod
    def load(cls, directory: Path | str, stack_name: str | None = None) -> Assembly:
        """The stack ``stack_name`` (the only stack when None) of the assembly in ``directory``."""
        directory = Path(directory)
        manifest_path = directory / "manifest.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{directory} holds no cloud assembly (no manifest.json): run `make synth` first")
        manifest = json.loads(manifest_path.read_text())
        stacks = {
            name: artifact
            for name, artifact in manifest.get("artifacts", {}).items()
            if artifact.get("type") == "aws:cloudformation:stack"
        }
        if stack_name is None:
            if len(stacks) != 1:
                raise TemplateError(f"{directory} holds {len(stacks)} stacks ({', '.join(stacks)}): name one")
            stack_name = next(iter(stacks))
        if stack_name not in stacks:
            raise TemplateError(f"{directory} has no stack {stack_name!r} (it has {', '.join(stacks)})")
        template_file = directory / stacks[stack_name]["properties"]["templateFile"]
        from local_runtime.nested import inline_nested_stacks  # it raises this module's TemplateError

        template = inline_nested_stacks(directory, json.loads(template_file.read_text()))
        return cls(directory=directory, stack_name=stack_name, template=template)

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return self.template.get("Resources", {})

    def of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {lid: r for lid, r in self.resources.items() if r["Type"] == resource_type}

    def asset_path(self, logical_id: str) -> Path:
        """Where the asset of a resource (a function's code, a layer, an image's build context) was staged."""
        metadata = self.resources[logical_id].get("Metadata", {})
        if "aws:asset:path" not in metadata:
            raise TemplateError(f"{logical_id} has no staged asset (aws:asset:path)")
        return self.directory / metadata["aws:asset:path"]


def dependencies(value: Any) -> set[str]:
    """Logical ids that ``value`` refers to through Ref, Fn::GetAtt or ${} in Fn::Sub."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "Ref" in node and isinstance(node["Ref"], str) and not node["Ref"].startswith("AWS::"):
                found.add(node["Ref"])
            if "Fn::GetAtt" in node:
                target = node["Fn::GetAtt"]
                found.add(target[0] if isinstance(target, list) else target.split(".")[0])
            if "Fn::Sub" in node:
                text = node["Fn::Sub"] if isinstance(node["Fn::Sub"], str) else node["Fn::Sub"][0]
                for name in _sub_names(text):
                    if not name.startswith("AWS::"):
                        found.add(name.split(".")[0])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(value)
    return found


def _sub_names(text: str) -> list[str]:
    names, start = [], 0
    while (open_at := text.find("${", start)) >= 0:
        close_at = text.find("}", open_at)
        if close_at < 0:
            break
        if not text.startswith("${!", open_at):
            names.append(text[open_at + 2 : close_at])
        start = close_at + 1
    return names


def deployment_order(resources: Mapping[str, dict[str, Any]]) -> list[str]:
    """Logical ids, each after every resource it refers to or depends on (what CloudFormation's graph does)."""
    edges = {}
    for logical_id, resource in resources.items():
        depends_on = resource.get("DependsOn", [])
        depends_on = [depends_on] if isinstance(depends_on, str) else depends_on
        edges[logical_id] = (dependencies(resource.get("Properties", {})) | set(depends_on)) & set(resources)
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == "done":
            return
        if state.get(node) == "visiting":
            raise TemplateError("dependency cycle: " + " -> ".join([*path, node]))
        state[node] = "visiting"
        for dependency in sorted(edges[node]):
            visit(dependency, [*path, node])
        state[node] = "done"
        order.append(node)

    for logical_id in sorted(resources):
        visit(logical_id, [])
    return order


Ref = Callable[[str], Any]
GetAtt = Callable[[str, str], Any]


class Resolver:
    """Resolves the intrinsic functions CDK emits (Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select, Fn::Split,
    Fn::Base64, Fn::GetAZs, Fn::If over template conditions) against a deployment's physical ids and attributes."""

    def __init__(self, template: dict[str, Any], ref: Ref, get_att: GetAtt) -> None:
        self._template = template
        self._ref = ref
        self._get_att = get_att
        self._parameters = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}

    def __call__(self, value: Any) -> Any:
        return self.resolve(value)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            return [item for item in (self.resolve(v) for v in value) if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((name, argument),) = value.items()
            function = self._FUNCTIONS.get(name)
            if function is not None:
                return function(self, argument)
            if name.startswith("Fn::"):
                raise TemplateError(f"intrinsic function {name} is not supported locally")
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not _NO_VALUE}

    def _fn_ref(self, name: str) -> Any:
        if name in PSEUDO_PARAMETERS:
            return _NO_VALUE if name == "AWS::NoValue" else PSEUDO_PARAMETERS[name]
        if name in self._parameters:
            return self._parameters[name]
        return self._ref(name)

    def _fn_get_att(self, argument: Any) -> Any:
        logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
        return self._get_att(logical_id, self.resolve(attribute))

    def _fn_join(self, argument: list[Any]) -> str:
        delimiter, items = argument
        return str(delimiter).join(str(item) for item in self.resolve(items))

    def _fn_sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else (argument[0], self.resolve(argument[1]))
        out, start = [], 0
        while (open_at := text.find("${", start)) >= 0:
            close_at = text.find("}", open_at)
            out.append(text[start:open_at])
            name = text[open_at + 2 : close_at]
            if name.startswith("!"):
                out.append("${" + name[1:] + "}")
            elif name in variables:
                out.append(str(variables[name]))
            elif "." in name and not name.startswith("AWS::"):
                out.append(str(self._fn_get_att(name)))
            else:
                out.append(str(self._fn_ref(name)))
            start = close_at + 1
        out.append(text[start:])
        return "".join(out)

    def _fn_select(self, argument: list[Any]) -> Any:
        index, items = self.resolve(argument[0]), self.resolve(argument[1])
        return items[int(index)]

    def _fn_split(self, argument: list[Any]) -> list[str]:
        delimiter, text = argument
        return str(self.resolve(text)).split(delimiter)

    def _fn_base64(self, argument: Any) -> str:
        return base64.b64encode(str(self.resolve(argument)).encode()).decode()

    def _fn_get_azs(self, argument: Any) -> list[str]:
        return [f"{LOCAL_REGION}a", f"{LOCAL_REGION}b", f"{LOCAL_REGION}c"]

    def _fn_if(self, argument: list[Any]) -> Any:
        condition, if_true, if_false = argument
        return self.resolve(if_true if self.condition(condition) else if_false)

    def condition(self, name: str) -> bool:
        spec = self._template.get("Conditions", {}).get(name)
        if spec is None:
            raise TemplateError(f"condition {name!r} is not in the template")
        return bool(self._evaluate(spec))

    def _evaluate(self, spec: Any) -> Any:
        if isinstance(spec, dict) and len(spec) == 1:
            ((name, argument),) = spec.items()
            if name == "Fn::Equals":
                left, right = (self._evaluate(a) for a in argument)
                return left == right
            if name == "Fn::Not":
                return not self._evaluate(argument[0])
            if name == "Fn::And":
                return all(self._evaluate(a) for a in argument)
            if name == "Fn::Or":
                return any(self._evaluate(a) for a in argument)
            if name == "Condition":
                return self.condition(argument)
        return self.resolve(spec)

    _FUNCTIONS: dict[str, Callable[[Resolver, Any], Any]] = {
        "Ref": _fn_ref,
        "Fn::GetAtt": _fn_get_att,
        "Fn::Join": _fn_join,
        "Fn::Sub": _fn_sub,
        "Fn::Select": _fn_select,
        "Fn::Split": _fn_split,
        "Fn::Base64": _fn_base64,
        "Fn::GetAZs": _fn_get_azs,
        "Fn::If": _fn_if,
    }


class _NoValue:
    def __repr__(self) -> str:
        return "AWS::NoValue"


_NO_VALUE = _NoValue()
