"""The operator's command line: ``python -m async_inference.cli dlq list|redrive`` and ``webhook-secret``.

These commands act on the deployed stack's resources with AWS credentials (not an API key), so they are the service's,
not the client package's: the queue URLs come from --dlq-url / --queue-url or JOBS_DLQ_URL / JOBS_QUEUE_URL (the
variables the stack sets), the tenants' signing-secret ARNs from --secret-arns or WEBHOOK_SECRET_ARNS (the stack output
WebhookSigningSecretArns, a JSON object tenant -> ARN). Output, --json and exit statuses are the client command's
(``async_inference_client.cli``); 1 also means a redrive left messages in the DLQ. A new operator command is a module
of its own and one ``command()`` line in ``build_parser``. ``preflight`` checks an account and this machine before the
first ``cdk deploy`` (``async_inference.preflight``); ``smoke`` sends one job through the deployed stack after it
(``async_inference.smoke``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from async_inference.aws import JobQueue, client
from async_inference.config import ENV_DLQ_URL, ENV_QUEUE_URL, ENV_WEBHOOK_SECRET_ARNS
from async_inference.schemas import ClaimCheck
from async_inference.webhooks.secrets import read_tenant_secrets
from async_inference_client.cli import (
    EXIT_NO_RESULT,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    CliError,
    Parser,
    emit,
    guarded,
)

PROG = "python -m async_inference.cli"


# --- Dead-letter queue (operators) -------------------------------------------------------------------------------

# How long `dlq list` hides what it reads: long enough to read the whole DLQ once, so that no message is counted twice.
DLQ_PEEK_VISIBILITY_S = 30


def _read_dlq(dlq: Any, limit: int) -> list[Any]:
    """Up to ``limit`` DLQ messages, each received once (hidden for DLQ_PEEK_VISIBILITY_S)."""
    messages: list[Any] = []
    while len(messages) < limit:
        batch = dlq.receive(
            max_messages=min(10, limit - len(messages)), wait_s=1, visibility_timeout_s=DLQ_PEEK_VISIBILITY_S
        )
        if not batch:
            break
        messages.extend(batch)
    return messages


def _describe(message: Any) -> dict[str, Any]:
    try:
        claim = ClaimCheck.model_validate_json(message.body)
    except ValidationError:
        return {
            "message_id": message.message_id,
            "receive_count": message.receive_count,
            "claim_check": None,
            "body": message.body[:200],
        }
    return {
        "message_id": message.message_id,
        "receive_count": message.receive_count,
        "job_id": claim.job_id,
        "tenant": claim.tenant,
        "model": claim.model,
        "deadline": claim.deadline.isoformat(),
    }


def _message_line(described: dict[str, Any]) -> str:
    head = f"  {described['message_id']}  received {described['receive_count']}x  "
    if described.get("job_id"):
        return head + f"job {described['job_id']}  tenant {described['tenant']}  model {described['model']}"
    return head + f"not a claim check: {described['body'][:80]!r}"


def cmd_dlq_list(args: argparse.Namespace) -> int:
    """Print what is in the DLQ, then make it visible again (listing moves nothing)."""
    dlq = JobQueue(args.dlq_url)
    messages = _read_dlq(dlq, args.limit)
    if messages:
        dlq.change_visibility_batch([m.receipt_handle for m in messages], 0)
    described = [_describe(m) for m in messages]
    listing = {"count": len(messages), "messages": described}
    emit(
        args,
        listing,
        lambda: (
            [f"{len(messages)} messages in the DLQ (listing moves none of them)"]
            + [_message_line(m) for m in described]
        ),
    )
    return EXIT_OK


def cmd_dlq_redrive(args: argparse.Namespace) -> int:
    """Move the DLQ's claim checks back to the job queue. Anything that is not a claim check stays for a person.

    A redriven job runs again only if it is not final yet: one whose DLQ handler already failed it stays failed (the
    worker deletes its claim check), so redrive is for messages the DLQ handler itself could not process."""
    dlq, queue = JobQueue(args.dlq_url), JobQueue(args.queue_url)
    messages = _read_dlq(dlq, args.limit)
    moved, kept = [], []
    for message in messages:
        try:
            claim = ClaimCheck.model_validate_json(message.body)
        except ValidationError:
            kept.append(message)
            continue
        queue.send(claim)  # sent before the delete: a crash in between duplicates a claim check, which is harmless
        moved.append(message)
    failed = dlq.delete_batch([m.receipt_handle for m in moved]) if moved else []
    if kept:
        dlq.change_visibility_batch([m.receipt_handle for m in kept], 0)
    left = [_describe(m) for m in kept]
    outcome = {"redriven": len(moved) - len(failed), "left_in_dlq": left, "delete_failed": len(failed)}
    emit(
        args,
        outcome,
        lambda: [
            f"redriven to the job queue: {outcome['redriven']}",
            f"left in the DLQ (not claim checks): {len(kept)}",
            *[_message_line(m) for m in left],
            *([f"redriven but not deleted from the DLQ: {len(failed)}"] if failed else []),
        ],
    )
    return EXIT_OK if not kept and not failed else EXIT_NO_RESULT


def _aws_failure(exc: Exception) -> CliError | None:
    """An AWS error as one line: refused (ClientError) or not reached (no credentials, no endpoint)."""
    if isinstance(exc, ClientError):
        return CliError(f"AWS refused the request: {exc}", EXIT_REFUSED)
    if isinstance(exc, BotoCoreError):
        return CliError(f"AWS could not be used: {exc}", EXIT_UNREACHABLE)
    return None


# --- Webhook signing secrets (operators) ----------------------------------------------------------------------------


def cmd_webhook_secret(args: argparse.Namespace) -> int:
    """Print a tenant's webhook signing secrets (newest first), or every tenant's, from the Secrets Manager secrets
    the stack created for them: what the operator hands the tenant to verify deliveries with."""
    try:
        arns = json.loads(args.secret_arns)
    except json.JSONDecodeError as exc:
        raise CliError(f"--secret-arns is not JSON ({exc}): give the stack output WebhookSigningSecretArns") from exc
    if not isinstance(arns, dict):
        raise CliError(
            '--secret-arns must be a JSON object {"tenant": "<secret ARN>"} (the stack output WebhookSigningSecretArns)'
        )
    secretsmanager = client("secretsmanager")
    tenants = [args.tenant] if args.tenant is not None else sorted(arns)
    try:
        secrets = {tenant: read_tenant_secrets(arns, tenant, secretsmanager) for tenant in tenants}
    except KeyError as exc:
        raise CliError(exc.args[0]) from exc
    if args.tenant is not None:
        listing: dict[str, Any] = {"tenant": args.tenant, "secrets": secrets[args.tenant]}
        emit(args, listing, lambda: list(listing["secrets"]))
    else:
        listing = {"tenants": secrets}
        emit(args, listing, lambda: [f"{tenant}  {' '.join(values)}" for tenant, values in secrets.items()])
    return EXIT_OK


def cmd_preflight(args: argparse.Namespace) -> int:
    """``async_inference.preflight``: each prerequisite of a first deploy, what is missing and how to fix it."""
    from async_inference import preflight

    return preflight.run(args)


def cmd_smoke(args: argparse.Namespace) -> int:
    """``async_inference.smoke``: one job through the deployed stack, from its outputs to the answer, timed."""
    from async_inference import smoke

    return smoke.run(args)


# --- Parser and entry point -----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        name: str, func: Callable[[argparse.Namespace], int], help_: str, parent: Any = sub
    ) -> argparse.ArgumentParser:
        found = parent.add_parser(name, help=help_, description=help_)
        found.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of text")
        found.set_defaults(func=func)
        return found

    dlq = sub.add_parser("dlq", help="inspect and redrive the dead-letter queue")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    for name, func, help_ in (
        ("list", cmd_dlq_list, "print the claim checks in the DLQ (moves nothing)"),
        ("redrive", cmd_dlq_redrive, "move the DLQ's claim checks back to the job queue"),
    ):
        operator = command(name, func, help_, parent=dlq_sub)
        operator.add_argument(
            "--dlq-url", default=os.environ.get(ENV_DLQ_URL), required=not os.environ.get(ENV_DLQ_URL)
        )
        if name == "redrive":
            operator.add_argument(
                "--queue-url", default=os.environ.get(ENV_QUEUE_URL), required=not os.environ.get(ENV_QUEUE_URL)
            )
        operator.add_argument("--limit", type=int, default=1000, help="at most this many messages (1000)")

    signing = command("webhook-secret", cmd_webhook_secret, "a tenant's webhook signing secret, to hand to the tenant")
    signing.add_argument("tenant", nargs="?", help="the tenant (default: every tenant)")
    signing.add_argument(
        "--secret-arns",
        default=os.environ.get(ENV_WEBHOOK_SECRET_ARNS),
        required=not os.environ.get(ENV_WEBHOOK_SECRET_ARNS),
        help=f"the stack output WebhookSigningSecretArns (or {ENV_WEBHOOK_SECRET_ARNS})",
    )

    from async_inference import preflight

    checks = command(
        "preflight",
        cmd_preflight,
        "platform teams: check the account and this machine before the first cdk deploy (AWS credentials)",
    )
    preflight.add_arguments(checks)

    from async_inference import smoke

    first_answer = command(
        "smoke",
        cmd_smoke,
        "platform teams: one job through the deployed stack (its outputs, a tenant's key, the wake, the answer), timed",
    )
    smoke.add_arguments(first_answer)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        try:
            return int(args.func(args))
        except Exception as exc:
            failure = _aws_failure(exc)
            if failure is None:
                raise
            raise failure from exc

    return guarded(command, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
