"""TenantStacks: the tenants' own resources in nested stacks, each tenant's by a hash of its id, so a stack of a
hundred tenants stays within CloudFormation's 500 resources per template.

Each tenant costs nine resources (its API key, usage plan and usage-plan key; its signing secret and catalog
parameter; its webhook queue, the queue's policy, its subscription to the result topic and its event source): the
root stack holds about 21 tenants with one model. With ``tenant_stacks`` = N (``AsyncInferenceServiceProps``) they
live in N nested stacks instead, tenant ``t`` in stack ``tenant_stack_index(t, N)``: a hash of its id, so adding or
removing a tenant never moves another (only changing N does, which replaces the moved tenants' keys and secrets:
docs/deploying.md, "Upgrading").

In a nested stack, a tenant's webhook queue and signing secret are named (``queue_name``, ``secret_name``) under a
prefix of the root stack's, so the dispatcher and the workers are granted them by that prefix (``queue_arns``,
``secret_arns``): one statement whatever the number of tenants, where a list of ARNs would pass IAM's 10,240 bytes of
inline policy per role at about 60 tenants.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from aws_cdk import ArnFormat, NestedStack, Stack
from constructs import Construct

from cdk.nag import rendered_account, rendered_arn_prefix

# A nested stack of this many tenants holds 9 x 45 = 405 resources and 3 x 45 = 135 outputs (each tenant's key id,
# secret ARN and queue URL, which the root stack reads; 180 with a second key each), under 500 and 200.
MAX_TENANTS_PER_STACK = 45
MAX_TENANT_STACKS = 50  # the root stack's own resources bound it first: each nested stack is one of them
SQS_QUEUE_NAME_CHARS = 80  # SQS: "up to 80 characters: alphanumeric characters, hyphens, and underscores"


def _digest(text: str, chars: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


def tenant_stack_index(tenant: str, stacks: int) -> int:
    """The nested stack (0 .. ``stacks`` - 1) that holds ``tenant``'s resources: a hash of its id alone, so it never
    depends on the other tenants."""
    return int(_digest(tenant, 16), 16) % stacks


class TenantStacks(Construct):
    """``count`` nested stacks ``Tenants<n>`` (those that hold a tenant), and where in them each tenant's resources go.

    :param tenants: the tenant ids.
    :param count: how many nested stacks the tenants are spread over (``tenant_stacks``).
    """

    def __init__(self, scope: Construct, id: str, *, tenants: Sequence[str], count: int) -> None:
        super().__init__(scope, id)
        if not 1 <= count <= MAX_TENANT_STACKS:
            raise ValueError(f"tenant_stacks must be between 1 and {MAX_TENANT_STACKS}, got {count}")
        self.index = {tenant: tenant_stack_index(tenant, count) for tenant in tenants}
        for n in range(count):
            held = sorted(t for t, i in self.index.items() if i == n)
            if len(held) > MAX_TENANTS_PER_STACK:
                raise ValueError(
                    f"tenant_stacks = {count} places {len(held)} tenants in nested stack {n} (at most "
                    f'{MAX_TENANTS_PER_STACK} fit): raise tenant_stacks (docs/deploying.md, "Tenants")'
                )
        self.stacks: dict[int, NestedStack] = {
            n: NestedStack(self, f"Tenants{n}", description=f"Tenants of nested stack {n} of {count}")
            for n in sorted(set(self.index.values()))
        }
        root = Stack.of(self).stack_name
        # The root stack's name (up to 128 characters) shortened, with a hash of it whole: stack-unique and short
        # enough that a queue name keeps room for the tenant id within SQS's 80 characters.
        self._queue_prefix = f"{root[:16]}-{_digest(root, 6)}-webhooks-"
        self._secret_prefix = f"{root}/webhook-signing/"

    def scope(self, tenant: str, concern: str) -> Construct:
        """The construct under which ``tenant``'s resources of ``concern`` (e.g. ``"Ingestion"``) are made."""
        stack = self.stacks[self.index[tenant]]
        return stack.node.try_find_child(concern) or Construct(stack, concern)

    def folder(self, tenant: str) -> str:
        """A path segment naming ``tenant``'s nested stack: a named resource moved to another nested stack is
        renamed too, since CloudFormation creates the new one before it deletes the old."""
        return f"stack{self.index[tenant]}"

    def queue_name(self, tenant: str) -> str:
        """``tenant``'s webhook queue's name: the prefix, its stack and its id (cut, with a hash, past 80 characters)."""
        name = f"{self._queue_prefix}{self.folder(tenant)}-{tenant}"
        if len(name) <= SQS_QUEUE_NAME_CHARS:
            return name
        return f"{name[: SQS_QUEUE_NAME_CHARS - 9]}-{_digest(tenant, 8)}"

    def queue_url(self, tenant: str) -> str:
        """``tenant``'s webhook queue's URL, from its name: what the workers send to, so that a stack beside the
        tenants' (a fleet's, ``fleet_stacks``) needs no reference to theirs, which would wait on the API."""
        stack = Stack.of(self)
        return f"https://sqs.{stack.region}.{stack.url_suffix}/{stack.account}/{self.queue_name(tenant)}"

    def secret_name(self, tenant: str) -> str:
        """``tenant``'s signing secret's name, under the root stack's name."""
        return f"{self._secret_prefix}{self.folder(tenant)}/{tenant}"

    def queue_arns(self) -> str:
        """Every tenant's webhook queue (and no other queue): the ARN of the queue name prefix."""
        return Stack.of(self).format_arn(
            service="sqs", resource=f"{self._queue_prefix}*", arn_format=ArnFormat.NO_RESOURCE_NAME
        )

    def secret_arns(self) -> str:
        """Every tenant's signing secret: the ARN of the secret name prefix (Secrets Manager adds six characters)."""
        return Stack.of(self).format_arn(
            service="secretsmanager",
            resource="secret",
            resource_name=f"{self._secret_prefix}*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def queues_finding(self) -> str:
        """cdk-nag's finding on a grant of ``queue_arns`` (partition, region and account as it writes them)."""
        stack = Stack.of(self)
        return f"AwsSolutions-IAM5[Resource::{rendered_arn_prefix(stack, 'sqs')}:{rendered_account(stack)}:{self._queue_prefix}*]"

    def secrets_finding(self) -> str:
        """cdk-nag's finding on a grant of ``secret_arns``."""
        stack = Stack.of(self)
        prefix = f"{rendered_arn_prefix(stack, 'secretsmanager')}:{rendered_account(stack)}:secret"
        return f"AwsSolutions-IAM5[Resource::{prefix}:{self._secret_prefix}*]"
