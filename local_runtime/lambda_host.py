"""One Lambda execution environment, locally: imports a handler from its deployment package and runs one event at a
time, as the Lambda runtime does. Standard library only.

Started by ``local_runtime.functions`` as ``python -I -S lambda_host.py --port P --handler module.fn --path DIR...``:
``-I -S`` leave out the virtualenv's site-packages and PYTHONPATH, so the handler sees only the directories given (the
function's code asset, its layers' ``python/`` directories, and what the Lambda runtime itself provides, boto3),
exactly what the deployed function's import path holds. An import the package lacks fails here as it would in AWS.

Protocol (the shape of Lambda's Invoke API): ``POST /invoke`` with the event as JSON; 200 with the handler's result
as JSON, or 200 with ``X-Amz-Function-Error: Unhandled`` and ``{"errorMessage", "errorType", "stackTrace"}``.
``GET /ready`` answers 200 once the handler module is imported (Lambda's init phase).

``POST /invoke-stream`` is InvokeWithResponseStream as API Gateway's streaming Lambda proxy integration reads it: the
handler's proxy response written as its metadata (the response without ``body``) as JSON, eight NUL bytes, then the
body as it is produced: a body that is an iterable of str or bytes is written chunk by chunk, each as soon as the
handler yields it (the function's whole run is under its timeout). A handler that fails before its first byte is
answered as ``/invoke`` answers it; one that fails later ends the stream, as Lambda cuts it.
"""

import argparse
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer


class Context:
    """The Lambda context object, with the attributes handlers and Powertools read."""

    def __init__(self, timeout_s: float) -> None:
        self.function_name = os.environ.get("AWS_LAMBDA_FUNCTION_NAME", "function")
        self.function_version = os.environ.get("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        self.memory_limit_in_mb = int(os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"))
        region = os.environ.get("AWS_REGION", "us-east-1")
        self.invoked_function_arn = f"arn:aws:lambda:{region}:123456789012:function:{self.function_name}"
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = os.environ.get("AWS_LAMBDA_LOG_GROUP_NAME", f"/aws/lambda/{self.function_name}")
        self.log_stream_name = os.environ.get("AWS_LAMBDA_LOG_STREAM_NAME", "local")
        self.identity = None
        self.client_context = None
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class TimedOut(BaseException):
    """Raised in the handler when the function's timeout passes (Lambda stops the invocation then)."""


def exit_when_orphaned() -> None:
    """Exit once the process that started this one is gone: it runs in a process group of its own, so nothing else
    would stop it when the local runtime is killed outright."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def main() -> None:
    exit_when_orphaned()
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--handler", required=True)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()
    sys.path[:0] = args.path
    os.chdir(args.path[0])  # LAMBDA_TASK_ROOT
    module_name, _, function_name = args.handler.rpartition(".")
    handler = getattr(importlib.import_module(module_name), function_name)

    def on_timeout(signum, frame):  # noqa: ANN001 - a signal handler
        raise TimedOut()

    signal.signal(signal.SIGALRM, on_timeout)

    class Host(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self._send(200, b"{}", {})

        def do_POST(self) -> None:  # noqa: N802
            event = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            if self.path == "/invoke-stream":
                self._stream(event)
                return
            context = Context(args.timeout)
            signal.setitimer(signal.ITIMER_REAL, args.timeout)
            try:
                result = handler(event, context)
                body, headers = json.dumps(result).encode(), {}
            except TimedOut:
                message = f"Task timed out after {args.timeout:.2f} seconds"
                print(f"{context.aws_request_id} {message}", file=sys.stderr, flush=True)
                body = json.dumps({"errorMessage": message, "errorType": "Sandbox.Timedout"}).encode()
                headers = {"X-Amz-Function-Error": "Unhandled"}
            except Exception as exc:  # the function's error, reported as Lambda reports it
                stack = traceback.format_exception(type(exc), exc, exc.__traceback__)
                print("".join(stack), file=sys.stderr, flush=True)
                body = json.dumps(
                    {"errorMessage": str(exc), "errorType": type(exc).__name__, "stackTrace": stack}
                ).encode()
                headers = {"X-Amz-Function-Error": "Unhandled"}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            self._send(200, body, headers)

        def _stream(self, event: object) -> None:
            context = Context(args.timeout)
            signal.setitimer(signal.ITIMER_REAL, args.timeout)
            started = False
            try:
                result = dict(handler(event, context))
                body = result.pop("body", None) or ""
                chunks = [body] if isinstance(body, (str, bytes)) else body
                self.send_response(200)
                self.end_headers()  # HTTP/1.0 without a length: the stream ends when the connection closes
                started = True
                self.wfile.write(json.dumps(result).encode() + b"\0" * 8)
                self.wfile.flush()
                for chunk in chunks:
                    self.wfile.write(chunk.encode() if isinstance(chunk, str) else chunk)
                    self.wfile.flush()
            except (TimedOut, Exception) as exc:  # noqa: BLE001 - reported as Lambda reports it
                stack = traceback.format_exception(type(exc), exc, exc.__traceback__)
                print("".join(stack), file=sys.stderr, flush=True)
                if not started:
                    error = {"errorMessage": str(exc) or type(exc).__name__, "errorType": type(exc).__name__}
                    self._send(200, json.dumps(error).encode(), {"X-Amz-Function-Error": "Unhandled"})
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        def _send(self, status: int, body: bytes, headers: dict) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *log_args):  # noqa: A002, ANN001 - the stdlib's names
            pass

    # One event at a time, as one execution environment: a plain (not threading) server.
    server = HTTPServer(("127.0.0.1", args.port), Host)
    # Lambda ends an execution environment without running the runtime's shutdown; a full interpreter shutdown of the
    # handler's imports costs most of a second of CPU per environment when the whole stack stops.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"ready {args.handler}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.path.pop(0)  # this script's own directory is not on the function's import path
    main()
