"""Deploys a synthesized template into moto server, resource by resource, the way CloudFormation would.

moto's own CloudFormation (``create_stack``) rejects this template (a MalformedPolicyDocument, and resource types it
cannot create), so this is a small deployer over the template JSON: resources in dependency order, intrinsics
resolved by ``local_runtime.template.Resolver``, and one table, ``local_runtime.resource_types.RESOURCE_TYPES``,
saying for every resource type what happens to it here:

* ``deploy``: created in moto with the properties the template gives (each handler names the properties it
  applies; ``SKIPPED_PROPERTIES`` lists the ones it does not, with the reason);
* ``emulate``: run by the local runtime itself from the template (functions, their event sources, the REST API, the
  WebSocket API, the worker's task definition): recorded here with the values a Ref or Fn::GetAtt of it gives;
* ``skip``: cannot run here (VPC, Auto Scaling, alarms, IAM...), with the reason and the template test that checks it
  instead.

The worker's ECS cluster, task definition and service are deployed (moto holds them and answers DescribeServices and
UpdateService, which the API's wake from zero calls); moto places no tasks, so the workers themselves run as local
processes from the task definition (``local_runtime.workers``).

A template with a resource type or a property in none of these fails the deploy (and
``tests/local/test_deployer_coverage.py``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from local_runtime.physical import Physical, arn_of
from local_runtime.resource_types import RESOURCE_TYPES
from local_runtime.template import Assembly, Resolver, TemplateError, deployment_order

if TYPE_CHECKING:
    from local_runtime.deletion import Deletion

logger = logging.getLogger("local_runtime.deployer")


def _physical_name(stack: str, logical_id: str, *, limit: int = 80, lower: bool = False) -> str:
    """A name in CloudFormation's style (stack-logicalid-suffix), stable for a given stack and logical id."""
    suffix = hashlib.sha1(f"{stack}/{logical_id}".encode()).hexdigest()[:12].upper()
    name = f"{stack}-{logical_id}"[: limit - len(suffix) - 1] + "-" + suffix
    return name.lower() if lower else name


class Deployment:
    """The resources of one template, deployed into the moto server that ``clients`` talk to."""

    def __init__(self, assembly: Assembly, clients: Callable[[str], Any], *, api_key_values: Mapping[str, str]) -> None:
        self.assembly = assembly
        self.stack_name = assembly.stack_name
        self._client = clients
        # API key name (the tenant) -> the value the key gets here; in AWS, API Gateway generates it at deploy.
        self.api_key_values = dict(api_key_values)
        self.resources: dict[str, Physical] = {}
        self.resolver = Resolver(assembly.template, self._ref, self._get_att)
        # Lambda functions that something invokes asynchronously (S3 notifications, SNS): logical id -> the local
        # queue standing in for Lambda's internal event queue.
        self.async_event_queues: dict[str, str] = {}
        self.outputs: dict[str, Any] = {}

    # --- the deploy -------------------------------------------------------------------------------------------------

    def deploy(self) -> Deployment:
        template_resources = self.assembly.resources
        unknown = sorted({r["Type"] for r in template_resources.values()} - set(RESOURCE_TYPES))
        if unknown:
            raise TemplateError(
                "resource types neither deployed, emulated nor listed as skipped in local_runtime.deployer: "
                + ", ".join(unknown)
            )
        for logical_id in deployment_order(template_resources):
            resource = template_resources[logical_id]
            if "Condition" in resource and not self.resolver.condition(resource["Condition"]):
                continue
            kind, handler = RESOURCE_TYPES[resource["Type"]]
            if kind == "skip":
                self.resources[logical_id] = _placeholder(self, logical_id, resource["Type"])
                continue
            properties = self.resolver(resource.get("Properties", {}))
            physical = handler(self, logical_id, properties)
            physical.properties = properties
            self.resources[logical_id] = physical
        self.outputs = {
            name: self.resolver(output["Value"]) for name, output in self.assembly.template.get("Outputs", {}).items()
        }
        return self

    def delete(self) -> Deletion:
        """Delete the stack as CloudFormation would: reverse dependency order, deletion policies honoured
        (``local_runtime.deletion``)."""
        from local_runtime.deletion import delete_stack  # it imports this module's table

        return delete_stack(self)

    def client(self, service: str) -> Any:
        return self._client(service)

    def name_for(self, logical_id: str, *, limit: int = 80, lower: bool = False) -> str:
        return _physical_name(self.stack_name, logical_id, limit=limit, lower=lower)

    def of_type(self, resource_type: str) -> dict[str, Physical]:
        return {lid: p for lid, p in self.resources.items() if p.type == resource_type}

    def has_ref(self, resource_type: str, ref: Any) -> bool:
        """Whether a deployed resource of ``resource_type`` has ``ref`` as its Ref or an attribute."""
        return any(p.ref == ref or ref in p.attributes.values() for p in self.of_type(resource_type).values())

    def by_ref(self, resource_type: str, ref: Any) -> Physical:
        for physical in self.of_type(resource_type).values():
            if physical.ref == ref or ref in physical.attributes.values():
                return physical
        raise TemplateError(f"no {resource_type} deployed with id {ref!r}")

    def _ref(self, logical_id: str) -> Any:
        if logical_id not in self.resources:
            raise TemplateError(f"Ref to {logical_id}, which is not deployed (yet)")
        return self.resources[logical_id].ref

    def _get_att(self, logical_id: str, attribute: str) -> Any:
        physical = self.resources.get(logical_id)
        if physical is None:
            raise TemplateError(f"Fn::GetAtt of {logical_id}, which is not deployed (yet)")
        if attribute not in physical.attributes:
            raise TemplateError(f"Fn::GetAtt {logical_id}.{attribute}: not an attribute the local {physical.type} has")
        return physical.attributes[attribute]

    def async_event_queue(self, function_logical_id: str) -> str:
        """The local queue that stands in for Lambda's event queue of an asynchronously invoked function."""
        if function_logical_id not in self.async_event_queues:
            name = self.name_for(f"{function_logical_id}AsyncEvents")
            url = self.client("sqs").create_queue(QueueName=name)["QueueUrl"]
            self.async_event_queues[function_logical_id] = url
        return self.async_event_queues[function_logical_id]

    def function_by_arn(self, arn: str) -> str:
        """Logical id of the function with this ARN (or name)."""
        for logical_id, physical in self.of_type("AWS::Lambda::Function").items():
            if arn in (physical.ref, physical.attributes["Arn"]):
                return logical_id
        raise TemplateError(f"no function {arn!r} in the template")


def _placeholder(deployment: Deployment, logical_id: str, resource_type: str) -> Physical:
    """A resource that does not run here still answers Ref and Fn::GetAtt, so that what refers to it resolves (an IAM
    role's ARN in a function's properties, a cluster's name in the worker's environment)."""
    service = resource_type.split("::")[1].lower()
    name = deployment.name_for(logical_id)
    arn = arn_of(service, f"{logical_id.lower()}/{name}")
    return Physical(logical_id, resource_type, ref=name, attributes=_AnyAttribute(arn=arn, name=name))


class _AnyAttribute(dict):
    """Attributes of a placeholder: Arn-like names give its ARN, anything else its name."""

    def __init__(self, *, arn: str, name: str) -> None:
        super().__init__(Arn=arn)
        self._name = name

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return self["Arn"] if key.endswith("Arn") else self._name
