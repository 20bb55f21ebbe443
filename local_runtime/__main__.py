"""``python -m local_runtime up|demo``: the whole service on 127.0.0.1."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from local_runtime.stack import LocalStack, parse_api_keys


def stack_from_env(**overrides: object) -> LocalStack:
    options = dict(
        api_port=int(os.environ.get("API_PORT", 8000)),
        moto_port=int(os.environ.get("MOTO_PORT", 5000)),
        api_keys=parse_api_keys(os.environ.get("LOCAL_API_KEYS")),
        workers=int(os.environ.get("WORKERS", 1)),
        engine=os.environ.get("ENGINE", "cpu"),
    )
    options.update(overrides)
    return LocalStack(**options)  # type: ignore[arg-type]


def up() -> int:
    stack = stack_from_env().start()
    print(f"API:     {stack.api_url}", flush=True)
    print(f"AWS:     {stack.moto.url} (moto server)", flush=True)
    for key, tenant in stack.api_keys.items():
        print(f"API key: {key}  (tenant {tenant})", flush=True)
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"))
    if args.command == "up":
        return up()
    from local_runtime.demo import run_demo

    return run_demo(stack_from_env())


if __name__ == "__main__":
    sys.exit(main())
