"""``python -m async_inference.webhooks verify|receive|new-secret``: the receiving side's helper (see
``docs/notifications.md``)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from standardwebhooks import WebhookVerificationError

from async_inference.webhooks.receiver import Delivery, Receiver
from async_inference.webhooks.signing import new_secret, verify


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m async_inference.webhooks", description="Verify, receive or sign per-job webhooks."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "verify", help="verify one delivery; prints its payload, exit 1 when it does not verify"
    )
    check.add_argument("--secret", required=True, help="your whsec_... signing secret")
    check.add_argument("--id", required=True, help="the webhook-id header")
    check.add_argument("--timestamp", required=True, help="the webhook-timestamp header")
    check.add_argument("--signature", required=True, help="the webhook-signature header")
    check.add_argument("body", help="a file holding the exact request body ('-' for stdin)")
    serve = commands.add_parser("receive", help="listen on 127.0.0.1 and print each delivery that verifies")
    serve.add_argument("--secret", required=True)
    serve.add_argument("--port", type=int, default=8081)
    serve.add_argument(
        "--save-dir",
        type=Path,
        help="write each body to DIR/<webhook-id>.json and print the verify command that checks it",
    )
    commands.add_parser("new-secret", help="print a fresh whsec_... secret")
    args = parser.parse_args(argv)

    if args.command == "new-secret":
        print(new_secret())
        return 0
    if args.command == "verify":
        body = sys.stdin.buffer.read() if args.body == "-" else open(args.body, "rb").read()
        headers = {"webhook-id": args.id, "webhook-timestamp": args.timestamp, "webhook-signature": args.signature}
        try:
            payload = verify(args.secret, headers, body)
        except WebhookVerificationError as exc:
            print(f"NOT verified: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(payload, indent=2))
        return 0
    receiver = Receiver(port=args.port, secret=args.secret).start()
    print(f"listening on {receiver.url}; deliveries that do not verify get 401", flush=True)
    if args.save_dir:
        args.save_dir.mkdir(parents=True, exist_ok=True)
    seen = 0
    try:
        while True:
            deliveries = receiver.wait_for(seen + 1, timeout_s=3600)
            for delivery in deliveries[seen:]:
                webhook_id = {k.lower(): v for k, v in delivery.headers.items()}.get("webhook-id")
                print(f"verified {webhook_id}: {delivery.body.decode()}", flush=True)
                if args.save_dir:
                    print(f"  check it yourself (within 5 minutes): {_verify_command(args, delivery)}", flush=True)
            seen = len(deliveries)
    except KeyboardInterrupt:
        receiver.stop()
    return 0


def _verify_command(args: argparse.Namespace, delivery: Delivery) -> str:
    """Save the delivery's body and return the ``verify`` command line that checks it."""
    headers = {name.lower(): value for name, value in delivery.headers.items()}
    body = args.save_dir / f"{Path(headers.get('webhook-id', 'delivery')).name}.json"
    body.write_bytes(delivery.body)
    words = [
        sys.executable,
        "-m",
        "async_inference.webhooks",
        "verify",
        "--secret",
        args.secret,
        "--id",
        headers.get("webhook-id", ""),
        "--timestamp",
        headers.get("webhook-timestamp", ""),
        "--signature",
        headers.get("webhook-signature", ""),
        str(body),
    ]
    return " ".join(shlex.quote(word) for word in words)


if __name__ == "__main__":
    sys.exit(main())
