"""Command line client: ``python -m async_inference.cli submit|status|result|cancel|list|dlq``.

The API URL and key come from ``--api-url`` / ``--api-key`` or ``ASYNC_INFERENCE_API_URL`` / ``ASYNC_INFERENCE_API_KEY``.
``dlq list`` and ``dlq redrive`` are operator commands: they use AWS credentials, not an API key, and the queue URLs
from ``--dlq-url`` / ``--queue-url`` or ``JOBS_DLQ_URL`` / ``JOBS_QUEUE_URL`` (the variables the stack sets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from async_inference.aws import JobQueue
from async_inference.client import ApiError, Client
from async_inference.config import ENV_DLQ_URL, ENV_QUEUE_URL
from async_inference.schemas import ClaimCheck

ENV_API_URL = "ASYNC_INFERENCE_API_URL"
ENV_API_KEY = "ASYNC_INFERENCE_API_KEY"


class Progress:
    """One status line, rewritten in place on a terminal, one line per change elsewhere."""

    def __init__(self, stream: Any = sys.stderr) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.monotonic()
        self._last = ""

    def __call__(self, job: dict[str, Any]) -> None:
        line = f"{job['job_id']}  {job['status']:<15} {time.monotonic() - self._started:6.1f} s"
        if self._tty:
            self._stream.write("\r" + line)
        elif job["status"] != self._last:
            self._stream.write(line + "\n")
        self._last = job["status"]
        self._stream.flush()

    def done(self) -> None:
        if self._tty:
            self._stream.write("\n")


def _request_from(args: argparse.Namespace) -> bytes:
    if args.file:
        return Path(args.file).read_bytes() if args.file != "-" else sys.stdin.buffer.read()
    request: dict[str, Any] = {"model": args.model, "messages": [{"role": "user", "content": args.prompt}]}
    if args.max_tokens is not None:
        request["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        request["temperature"] = args.temperature
    return json.dumps(request).encode()


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2))


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    body = _request_from(args)
    metadata = dict(kv.split("=", 1) for kv in args.metadata)
    webhook = {"url": args.webhook} if args.webhook else None
    if args.upload:
        job = client.submit_upload(body, metadata=metadata)
    else:
        job = client.submit(json.loads(body), metadata=metadata, webhook=webhook, idempotency_key=args.idempotency_key)
    if not args.wait:
        _print(job)
        return 0
    progress = Progress()
    job = client.wait(job["job_id"], timeout_s=args.timeout, on_poll=progress)
    progress.done()
    if job["status"] == "succeeded":
        _print(client.result(job))
        return 0
    _print(job)
    return 1


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    _print(client.get(args.job_id))
    return 0


def cmd_result(client: Client, args: argparse.Namespace) -> int:
    job = client.get(args.job_id)
    if job["status"] != "succeeded":
        print(f"job {args.job_id} is {job['status']}" + (f": {job['error']}" if job.get("error") else ""), file=sys.stderr)
        return 1
    _print(client.result(job))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    _print(client.cancel(args.job_id))
    return 0


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    _print(client.list(status=args.status, limit=args.limit, next_token=args.next))
    return 0


# --- Dead-letter queue (operators) -------------------------------------------------------------------------------

# How long `dlq list` hides what it reads: long enough to read the whole DLQ once, so that no message is counted twice.
DLQ_PEEK_VISIBILITY_S = 30


def _read_dlq(dlq: JobQueue, limit: int) -> list[Any]:
    """Up to ``limit`` DLQ messages, each received once (hidden for DLQ_PEEK_VISIBILITY_S)."""
    messages: list[Any] = []
    while len(messages) < limit:
        batch = dlq.receive(max_messages=min(10, limit - len(messages)), wait_s=1, visibility_timeout_s=DLQ_PEEK_VISIBILITY_S)
        if not batch:
            break
        messages.extend(batch)
    return messages


def _describe(message: Any) -> dict[str, Any]:
    try:
        claim = ClaimCheck.model_validate_json(message.body)
    except ValidationError:
        return {"message_id": message.message_id, "receive_count": message.receive_count, "claim_check": None,
                "body": message.body[:200]}
    return {"message_id": message.message_id, "receive_count": message.receive_count, "job_id": claim.job_id,
            "tenant": claim.tenant, "model": claim.model, "deadline": claim.deadline.isoformat()}


def cmd_dlq_list(args: argparse.Namespace) -> int:
    """Print what is in the DLQ, then make it visible again (listing moves nothing)."""
    dlq = JobQueue(args.dlq_url)
    messages = _read_dlq(dlq, args.limit)
    if messages:
        dlq.change_visibility_batch([m.receipt_handle for m in messages], 0)
    _print({"count": len(messages), "messages": [_describe(m) for m in messages]})
    return 0


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
    _print({"redriven": len(moved) - len(failed), "left_in_dlq": [_describe(m) for m in kept],
            "delete_failed": len(failed)})
    return 0 if not kept and not failed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="async-inference", description=__doc__)
    parser.add_argument("--api-url", default=os.environ.get(ENV_API_URL, "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get(ENV_API_KEY))
    sub = parser.add_subparsers(dest="command", required=True)

    submit = sub.add_parser("submit", help="submit a job (inline, or --upload for the presigned-upload path)")
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", help="a chat.completions request body as JSON ('-' for stdin)")
    source.add_argument("--prompt", help="a single user message")
    submit.add_argument("--model", default="SmolLM2-135M-Instruct")
    submit.add_argument("--max-tokens", type=int)
    submit.add_argument("--temperature", type=float)
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--webhook", help="https URL to notify when the job completes")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--upload", action="store_true", help="send the body through a presigned S3 upload")
    submit.add_argument("--wait", action="store_true", help="wait for the job with a progress display")
    submit.add_argument("--timeout", type=float, default=600.0)
    submit.set_defaults(func=cmd_submit)

    for name, func, help_ in (("status", cmd_status, "a job's status"), ("result", cmd_result, "a job's result"),
                              ("cancel", cmd_cancel, "cancel a job")):
        command = sub.add_parser(name, help=help_)
        command.add_argument("job_id")
        command.set_defaults(func=func)

    listing = sub.add_parser("list", help="your jobs, newest first")
    listing.add_argument("--status")
    listing.add_argument("--limit", type=int)
    listing.add_argument("--next")
    listing.set_defaults(func=cmd_list)

    dlq = sub.add_parser("dlq", help="operators: inspect and redrive the dead-letter queue (AWS credentials)")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True)
    for name, func, help_ in (("list", cmd_dlq_list, "print the claim checks in the DLQ (moves nothing)"),
                              ("redrive", cmd_dlq_redrive, "move the DLQ's claim checks back to the job queue")):
        command = dlq_sub.add_parser(name, help=help_)
        command.add_argument("--dlq-url", default=os.environ.get(ENV_DLQ_URL), required=not os.environ.get(ENV_DLQ_URL))
        if name == "redrive":
            command.add_argument("--queue-url", default=os.environ.get(ENV_QUEUE_URL),
                                 required=not os.environ.get(ENV_QUEUE_URL))
        command.add_argument("--limit", type=int, default=1000, help="at most this many messages (1000)")
        command.set_defaults(func=func, operator=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "operator", False):
        return args.func(args)
    if not args.api_key:
        print(f"no API key: pass --api-key or set {ENV_API_KEY}", file=sys.stderr)
        return 2
    try:
        return args.func(Client(args.api_url, args.api_key), args)
    except ApiError as exc:
        print(str(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
