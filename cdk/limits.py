"""The AWS quotas a synthesized template meets or fails only at deploy time, and one template's figures against them.

CloudFormation refuses a stack over its resource, output or parameter count, or a template over its size, when the
deploy starts; Lambda refuses a function whose environment is over 4 KB, and IAM a role whose inline policies pass
10,240 characters, when CloudFormation creates them, half-way through. ``figures`` reads them from the template JSON, so a test can hold every stack of the app under them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# "AWS CloudFormation quotas" (CloudFormation User Guide): resources, outputs and parameters declared in one template;
# the template body's size when it is read from S3, as the CDK deploys it (a body passed inline may hold 51,200 bytes).
MAX_RESOURCES = 500
MAX_OUTPUTS = 200
MAX_PARAMETERS = 200
MAX_TEMPLATE_BYTES = 1_048_576
# "Lambda quotas" (Lambda Developer Guide): "Function environment variables: 4 KB, for all environment variables
# associated with the function, in aggregate", counted over the resolved names and values.
MAX_ENVIRONMENT_BYTES = 4096
# "IAM and AWS STS quotas" (IAM User Guide): "Role policy size: the total size of all inline policies for a role
# cannot exceed 10,240 characters" (white space not counted); each AWS::IAM::Policy of a template is an inline policy.
MAX_ROLE_POLICY_BYTES = 10_240
# What a Ref or Fn::GetAtt resolves to is not in the template: an ARN, a queue URL or a generated name. Each counts as
# this many bytes (an SQS queue URL with a CloudFormation-generated 80-character name is about 135; a Lambda or SNS
# ARN under 128), so an environment under the quota here is under it deployed.
RESOLVED_TOKEN_BYTES = 140
_PSEUDO_BYTES = {"AWS::Region": 14, "AWS::Partition": 10, "AWS::AccountId": 12, "AWS::URLSuffix": 13}


@dataclass(frozen=True)
class Figures:
    """One template against the quotas: counts, its size, its largest function environment and its largest role's
    inline policies."""

    resources: int
    outputs: int
    parameters: int
    template_bytes: int
    largest_environment_bytes: int
    largest_environment: str  # the function's logical id ("" without functions)
    largest_role_policy_bytes: int = 0
    largest_role_policy: str = ""  # the role's logical id ("" without roles)

    def over(self) -> list[str]:
        """Each quota the template passes, named with its figure and the quota."""
        checks = [
            ("resources", self.resources, MAX_RESOURCES),
            ("outputs", self.outputs, MAX_OUTPUTS),
            ("parameters", self.parameters, MAX_PARAMETERS),
            ("template bytes", self.template_bytes, MAX_TEMPLATE_BYTES),
            (f"environment bytes of {self.largest_environment}", self.largest_environment_bytes, MAX_ENVIRONMENT_BYTES),
            (
                f"inline policy bytes of {self.largest_role_policy}",
                self.largest_role_policy_bytes,
                MAX_ROLE_POLICY_BYTES,
            ),
        ]
        return [f"{name}: {value} over {limit}" for name, value, limit in checks if value > limit]


def resolved_bytes(value: Any) -> int:
    """Bytes ``value`` takes once CloudFormation resolves it: literals as written, each Ref or Fn::GetAtt as
    ``RESOLVED_TOKEN_BYTES`` (a pseudo parameter as its longest value), Fn::Join as its parts and separators."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (int, float, bool)):
        return len(json.dumps(value))
    if isinstance(value, dict) and len(value) == 1:
        [(key, inner)] = value.items()
        if key == "Ref":
            return _PSEUDO_BYTES.get(inner, RESOLVED_TOKEN_BYTES)
        if key == "Fn::GetAtt":
            return RESOLVED_TOKEN_BYTES
        if key == "Fn::Join":
            separator, parts = inner
            return sum(resolved_bytes(part) for part in parts) + len(separator) * max(len(parts) - 1, 0)
    return len(json.dumps(value))  # any other intrinsic: as written, a bound good enough for a rare case


def resolved_json_bytes(value: Any) -> int:
    """Bytes of ``value`` written as compact JSON once CloudFormation resolves it (an intrinsic as ``resolved_bytes``
    counts it, in quotes): how IAM measures a policy document."""
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("Ref", "Fn::GetAtt", "Fn::Join"):
        return resolved_bytes(value) + 2
    if isinstance(value, dict):
        items = [len(json.dumps(key)) + 1 + resolved_json_bytes(item) for key, item in value.items()]
        return 2 + sum(items) + max(len(items) - 1, 0)
    if isinstance(value, list):
        return 2 + sum(resolved_json_bytes(item) for item in value) + max(len(value) - 1, 0)
    return len(json.dumps(value))


def role_policy_bytes(resources: dict[str, Any]) -> dict[str, int]:
    """Each role's inline policies once resolved, by the role's logical id: its own ``Policies`` and every
    AWS::IAM::Policy of the template attached to it."""
    sizes = {
        logical_id: sum(resolved_json_bytes(p["PolicyDocument"]) for p in r.get("Properties", {}).get("Policies", []))
        for logical_id, r in resources.items()
        if r["Type"] == "AWS::IAM::Role"
    }
    for policy in resources.values():
        if policy["Type"] != "AWS::IAM::Policy":
            continue
        for role in policy["Properties"].get("Roles", []):
            if isinstance(role, dict) and role.get("Ref") in sizes:
                sizes[role["Ref"]] += resolved_json_bytes(policy["Properties"]["PolicyDocument"])
    return sizes


def environment_bytes(function: dict[str, Any]) -> int:
    """A function resource's environment once resolved: every name and value (Lambda's quota counts both)."""
    variables = function.get("Properties", {}).get("Environment", {}).get("Variables", {})
    return sum(len(name.encode()) + resolved_bytes(value) for name, value in variables.items())


def figures(template: dict[str, Any], template_bytes: int | None = None) -> Figures:
    """The template's figures; ``template_bytes``: its file's size (default: its compact JSON's)."""
    resources = template.get("Resources", {})
    environments = {
        logical_id: environment_bytes(resource)
        for logical_id, resource in resources.items()
        if resource["Type"] == "AWS::Lambda::Function"
    }
    largest = max(environments, key=lambda k: environments[k], default="")
    policies = role_policy_bytes(resources)
    largest_role = max(policies, key=lambda k: policies[k], default="")
    return Figures(
        resources=len(resources),
        outputs=len(template.get("Outputs", {})),
        parameters=len(template.get("Parameters", {})),
        template_bytes=template_bytes if template_bytes is not None else len(json.dumps(template).encode()),
        largest_environment_bytes=environments.get(largest, 0),
        largest_environment=largest,
        largest_role_policy_bytes=policies.get(largest_role, 0),
        largest_role_policy=largest_role,
    )


def synthetic_context(
    tenants: int, models: int, tenant_stacks: int = 0, *, fleet_stacks: bool = False
) -> dict[str, Any]:
    """Context for ``tenants`` tenants on the default plan and ``models`` chat models of one task each (the first is
    ``model``), the tenants in ``tenant_stacks`` nested stacks (0: in the stack itself), each model's fleet in a
    nested stack of its own with ``fleet_stacks``: what the measurements in docs/deploying.md ("Tenants")
    synthesize."""
    names = [f"org/model-{n}" for n in range(models)]
    specs = [{"name": name, "max_num_seqs": 64, "max_worker_tasks": 1, "max_gpu_instances": 1} for name in names]
    return {
        "tenants": json.dumps({f"tenant-{n}": {} for n in range(tenants)}),
        "model": names[0],
        "max_num_seqs": 64,
        "models": json.dumps(specs),
        "tenant_stacks": tenant_stacks,
        "fleet_stacks": fleet_stacks,
    }


def assembly_figures(outdir: Path) -> dict[str, Figures]:
    """Every template of the cloud assembly in ``outdir`` (each stack's and each nested stack's), by file name."""
    return {
        path.name: figures(json.loads(path.read_text()), path.stat().st_size)
        for path in sorted(outdir.glob("*.template.json"))
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m cdk.limits --tenants N --models M``: synthesize the app (cdk.json's context) with that many tenants
    and models and print each template's figures, or why the synth refused it."""
    import argparse
    import tempfile

    from aws_cdk import App

    from app import build, synth

    parser = argparse.ArgumentParser(prog="python -m cdk.limits", description=main.__doc__)
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--models", type=int, default=1)
    parser.add_argument("--tenant-stacks", type=int, default=0, help="nested stacks for the tenants (tenant_stacks)")
    parser.add_argument("--fleet-stacks", action="store_true", help="each model's fleet in a nested stack")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[1]
    measured = synthetic_context(args.tenants, args.models, args.tenant_stacks, fleet_stacks=args.fleet_stacks)
    context = {**json.loads((root / "cdk.json").read_text())["context"], **measured}
    with tempfile.TemporaryDirectory() as outdir:
        try:
            app = App(context=context, outdir=outdir)
            build(app)
            synth(app)
        except (RuntimeError, ValueError) as exc:  # over 500 resources (the CDK), or more models than MAX_MODELS
            print(f"{args.tenants} tenants x {args.models} models: not synthesized: {str(exc).splitlines()[0]}")
            return 1
        for name, found in assembly_figures(Path(outdir)).items():
            print(
                f"{args.tenants} tenants x {args.models} models: {name}: {found.resources} resources, "
                f"{found.outputs} outputs, {found.template_bytes / 1024:.0f} KB, largest environment "
                f"{found.largest_environment_bytes} bytes ({found.largest_environment}), largest role policy "
                f"{found.largest_role_policy_bytes} bytes ({found.largest_role_policy}); over: {found.over() or 'none'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
