"""Command line client: ``python -m async_inference.cli submit|status|result|cancel|list|dlq``.

The API URL and key come from ``--api-url`` / ``--api-key`` or ``ASYNC_INFERENCE_API_URL`` / ``ASYNC_INFERENCE_API_KEY``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from async_inference.client import ApiError, Client

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
