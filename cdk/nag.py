"""cdk-nag acknowledgments, written next to the resource they concern, each with the reason a reviewer needs."""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Token, Validations
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
