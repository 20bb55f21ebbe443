"""``python -m local_runtime up|demo``: the whole service on 127.0.0.1, deployed from the synthesized template.

``make up`` and ``make demo`` synthesize ``cdk.out/`` first (``make synth``); ``LOCAL_ASSEMBLY`` names another
cloud assembly directory. ``up --outputs-file F`` writes the stack's outputs (resource names, as
``cdk deploy --outputs-file`` does) and the local endpoints to F once everything runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

from async_inference.config import ENV_WEBHOOK_SECRET_ARN
from local_runtime.stack import DEFAULT_ASSEMBLY, LocalStack, parse_api_keys


def stack_from_env(**overrides: object) -> LocalStack:
    options = dict(
        assembly=Path(os.environ.get("LOCAL_ASSEMBLY") or DEFAULT_ASSEMBLY),
        api_port=int(os.environ.get("API_PORT", 8000)),
        moto_port=int(os.environ.get("MOTO_PORT", 5000)),
        ws_port=int(os.environ.get("WS_PORT", 8001)),
        api_keys=parse_api_keys(os.environ.get("LOCAL_API_KEYS")),
        workers=int(os.environ.get("WORKERS", 1)),
        engine=os.environ.get("ENGINE", "cpu"),
        log_dir=os.environ.get("LOCAL_LOG_DIR") or None,
    )
    options.update(overrides)
    return LocalStack(**options)  # type: ignore[arg-type]


def up(outputs_file: str | None) -> int:
    stack = stack_from_env().start()
    assert stack.resources is not None
    print(f"API:     {stack.api_url}", flush=True)
    if stack.ws_url:
        print(f"WebSocket: {stack.ws_url}  (subscribe to job events; ASYNC_INFERENCE_WS_URL for the SDK)", flush=True)
    print(f"AWS:     {stack.moto.url} (moto server; the stack deployed from {stack.assembly_dir})", flush=True)
    for key, tenant in stack.api_keys.items():
        print(f"API key: {key}  (tenant {tenant})", flush=True)
    for tenant, secret in stack.webhook_secrets.items():
        print(f"Webhook signing secret of {tenant}: {secret}", flush=True)
    # What the operator commands (python -m async_inference.cli dlq ..., webhook-secret) need to reach this stack, as in AWS the
    # operator's credentials and the stack's outputs would give them.
    operator_env = {**stack.env, ENV_WEBHOOK_SECRET_ARN: stack.resources.webhook_secret_arn}
    print("Operator commands (python -m async_inference.cli dlq list, webhook-secret TENANT) need:\n  export "
          + " ".join(f"{name}={shlex.quote(value)}" for name, value in operator_env.items()), flush=True)
    print(f"Logs:    {stack.log_dir}", flush=True)
    if outputs_file:
        document = {"outputs": stack.resources.outputs, "api_url": stack.api_url, "ws_url": stack.ws_url,
                    "aws_endpoint_url": stack.moto.url,
                    "webhook_secrets": stack.webhook_secrets, "log_dir": str(stack.log_dir)}
        Path(outputs_file).write_text(json.dumps(document, indent=2))
    print(f"Workers: {stack.worker_count} x engine '{stack.engine}'. Ctrl-C stops everything.", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    try:
        stopped.wait()
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping...", flush=True)
        stack.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="local_runtime")
    parser.add_argument("command", choices=["up", "demo"])
    parser.add_argument("--outputs-file", help="up: write the stack's outputs and endpoints here as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"))
    if args.command == "up":
        return up(args.outputs_file)
    from local_runtime.demo import run_demo

    return run_demo(stack_from_env())


if __name__ == "__main__":
    sys.exit(main())
