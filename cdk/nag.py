"""cdk-nag acknowledgments, written next to the resource they concern, each with the reason a reviewer needs."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnElement, Names, Stack, Token, Validations
from constructs import IConstruct


def acknowledge(construct: IConstruct, findings: dict[str, str]) -> None:
    """Acknowledge cdk-nag findings (``Rule`` or ``Rule[Finding]``) on ``construct`` and its children."""
    for finding, reason in findings.items():
        Validations.of(construct).acknowledge(Acknowledgment(id=finding, reason=reason))


def rendered_arn_prefix(stack: Stack, service: str) -> str:
    """``arn:<partition>:<service>:<region>`` as cdk-nag writes it in finding ids (pseudo-parameters when unknown)."""
    partition = "<AWS::Partition>" if Token.is_unresolved(stack.partition) else stack.partition
    region = "<AWS::Region>" if Token.is_unresolved(stack.region) else stack.region
    return f"arn:{partition}:{service}:{region}"


def rendered_account(stack: Stack) -> str:
    """The account as cdk-nag writes it in finding ids: the number of a stack with an environment (``cdk deploy`` sets
    one from the credentials), ``<AWS::AccountId>`` otherwise."""
    return "<AWS::AccountId>" if Token.is_unresolved(stack.account) else stack.account


def rendered_reference(consumer: IConstruct, target: CfnElement, attribute: str = "Ref") -> str:
    """A Ref (``attribute`` "Ref") or Fn::GetAtt of ``target`` as cdk-nag writes it in a finding of ``consumer``'s
    template: ``<LogicalId>`` or ``<LogicalId.Attribute>`` in the target's own stack; across a nested stack's
    boundary, the parameter (target in the parent) or the nested stack's output (target in a nested stack) that the
    CDK makes for the reference, named by the target's unique id and the attribute."""
    stack, home = Stack.of(consumer), Stack.of(target)
    if stack is home:
        logical = home.get_logical_id(target)
        return f"<{logical}>" if attribute == "Ref" else f"<{logical}.{attribute}>"
    name = f"{Names.unique_id(target)}{attribute}"
    if home.nested_stack_resource is not None and Stack.of(home.nested_stack_resource) is stack:
        return f"<{stack.get_logical_id(home.nested_stack_resource)}.Outputs.{name}>"
    return f"<referenceto{name}>"
