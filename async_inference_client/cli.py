"""Command line client: ``async-inference submit|wait|status|result|cancel|list|batch``
(``python -m async_inference_client.cli``).

``batch submit FILE.jsonl [--wait]`` uploads an OpenAI batch input file and creates a batch (``--wait``: a progress
bar over its request counts until it is final); ``batch status|list|cancel|output`` follow it (docs/batches.md).

The API URL and key come from --api-url / --api-key or ASYNC_INFERENCE_API_URL / ASYNC_INFERENCE_API_KEY (the local
stack, ``make up``, serves http://127.0.0.1:8000). --ws-url or ASYNC_INFERENCE_WS_URL lets --wait be told over the
WebSocket API instead of polling. Output is for people; --json prints the API's objects as JSON. A failure is one
line on stderr and an exit status:

  0    done
  1    the job or batch ended without a result (failed, cancelled, expired)
  2    bad arguments or input
  3    the API refused the request
  4    the API could not be reached
  5    --wait gave up before the job was final (the job goes on)
  70   a bug in this client
  130  interrupted

The operator commands (the dead-letter queue, webhook signing secrets) use AWS credentials and are the service's:
``python -m async_inference.cli`` in a checkout of the service (docs/guarantees.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel
from tqdm import tqdm

from async_inference_client._base_client import ENV_API_KEY, ENV_API_URL, ENV_WS_URL
from async_inference_client.client import Client
from async_inference_client.errors import (
    ApiError,
    ApiUnreachable,
    BatchWaitTimeout,
    NoResult,
    UnexpectedResponse,
    WaitTimeout,
)
from async_inference_client.models.batches import BATCH_ID_PATTERN, Batch, Page
from async_inference_client.models.chat import ChatCompletion
from async_inference_client.models.jobs import JobList, JobStatus, JobView, is_job_id
from async_inference_client.types import JobUpdate

PROG = "async-inference"
EXIT_OK = 0
EXIT_NO_RESULT = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_WAIT_TIMEOUT = 5
EXIT_BUG = 70
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report as one line with an exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- Output ---------------------------------------------------------------------------------------------------------


class Progress:
    """``wait()``'s ``on_update``: on a terminal, a line that counts the job's tokens as it generates them (tqdm; there
    is no bar to fill, since a job's length is not known until it ends); one line per status change elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._started = time.monotonic()
        self._last: JobStatus | None = None
        self._bar = None
        if stream.isatty():
            self._bar = tqdm(total=None, file=stream, leave=True, bar_format="{desc} {n} tokens {elapsed}")

    def __call__(self, update: JobUpdate) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"{update.job_id} {update.status.value:<9}", refresh=False)
            usage = update.job.usage if update.job is not None else None
            if usage is not None:  # the final count
                self._bar.n = usage.completion_tokens
            elif update.progress is not None:
                self._bar.n = update.progress.completion_tokens
            self._bar.refresh()
        elif update.status != self._last:
            elapsed = time.monotonic() - self._started
            self._stream.write(f"{update.job_id}  {update.status.value:<15} {elapsed:6.1f} s\n")
            self._stream.flush()
        self._last = update.status

    def done(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _jsonable(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def emit(args: argparse.Namespace, value: Any, lines: Callable[[], list[str]]) -> None:
    """``value`` as JSON with --json, else as the ``lines`` for people."""
    print(json.dumps(_jsonable(value), indent=2) if args.json else "\n".join(lines()))


def _when(moment: Any) -> str | None:
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if moment else None


def _job_lines(job: JobView) -> list[str]:
    usage = job.usage
    webhook = job.webhook
    rows = [
        ("job", job.job_id),
        ("status", job.status.value),
        ("model", job.model),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
        ("attempts", str(job.attempts) if job.attempts else None),
        ("error", job.error),
        ("usage", f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens" if usage else None),
        ("result", f"ready, its URL valid until {_when(job.result.expires_at)}" if job.result else None),
        ("upload", f"PUT to the presigned URL before {_when(job.upload.expires_at)}" if job.upload else None),
        ("webhook", f"{webhook.url} ({webhook.status}, {len(webhook.attempts)} attempts)" if webhook else None),
        ("metadata", ", ".join(f"{k}={v}" for k, v in job.metadata.items()) or None),
    ]
    return [f"{name:<9} {value}" for name, value in rows if value]


def _list_lines(page: JobList) -> list[str]:
    if not page.jobs:
        return ["no jobs"]
    lines = [f"{'JOB':<36}  {'STATUS':<15}  {'CREATED':<23}  MODEL"]
    lines += [f"{j.job_id:<36}  {j.status.value:<15}  {_when(j.created_at):<23}  {j.model or ''}" for j in page.jobs]
    if page.next:
        lines.append(f"more: {PROG} list --next {page.next}")
    return lines


def _answer_lines(completion: ChatCompletion) -> list[str]:
    """Each choice's text, and its tool calls (a choice that only called tools has no text)."""
    lines: list[str] = []
    for choice in completion.choices:
        message = choice.message
        if message.content is not None:
            lines.append(message.content)
        calls = [c.function for c in message.tool_calls or ()] + (
            [message.function_call] if message.function_call else []
        )
        lines += [f"tool call: {call.name}({call.arguments})" for call in calls]
    return lines


# --- Input ----------------------------------------------------------------------------------------------------------


def _job_id(value: str) -> str:
    if not is_job_id(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id (job_ and 32 hex digits)")
    return value


def _metadata(pairs: list[str]) -> dict[str, str]:
    metadata = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--metadata {pair!r} is not KEY=VALUE")
        metadata[key] = value
    return metadata


def _request_from(args: argparse.Namespace) -> bytes:
    """The request body: the --file as given (checked to be a JSON object), or one built from --prompt."""
    if not args.file:
        request: dict[str, Any] = {"model": args.model, "messages": [{"role": "user", "content": args.prompt}]}
        if args.max_tokens is not None:
            request["max_tokens"] = args.max_tokens
        if args.temperature is not None:
            request["temperature"] = args.temperature
        return json.dumps(request).encode()
    name = "stdin" if args.file == "-" else args.file
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read --file {name}: {exc.strerror or exc}") from exc
    try:
        parsed = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not text
        raise CliError(f"--file {name} is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise CliError(
            f"--file {name} holds a JSON {type(parsed).__name__}; it must be an object (a chat.completions body)"
        )
    return data


# --- Commands -------------------------------------------------------------------------------------------------------


def _wait_and_show(client: Client, args: argparse.Namespace, job_id: str) -> int:
    progress = Progress()
    try:
        job = client.wait(job_id, timeout_s=args.timeout, on_update=progress)
    finally:
        progress.done()
    if job.status is JobStatus.SUCCEEDED:
        completion = client.result(job)
        emit(args, completion, lambda: _answer_lines(completion))
        return EXIT_OK
    emit(args, job, lambda: _job_lines(job))
    return EXIT_NO_RESULT


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    metadata = _metadata(args.metadata)
    body = _request_from(args)
    options = {"metadata": metadata, "webhook": args.webhook, "idempotency_key": args.idempotency_key}
    job = client.submit_upload(body, **options) if args.upload else client.submit(json.loads(body), **options)
    if not args.wait:
        emit(args, job, lambda: _job_lines(job))
        return EXIT_OK
    return _wait_and_show(client, args, job.job_id)


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    return _wait_and_show(client, args, args.job_id)


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    job = client.get(args.job_id)
    emit(args, job, lambda: _job_lines(job))
    return EXIT_OK


def cmd_result(client: Client, args: argparse.Namespace) -> int:
    completion = client.result(args.job_id)
    emit(args, completion, lambda: _answer_lines(completion))
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.cancel(args.job_id)
    emit(args, job, lambda: _job_lines(job))
    return EXIT_OK


def cmd_list(client: Client, args: argparse.Namespace) -> int:
    page = client.list(status=args.status, limit=args.limit, next_token=args.next)
    emit(args, page, lambda: _list_lines(page))
    return EXIT_OK


# --- Batches ----------------------------------------------------------------------------------------------------


class BatchProgress:
    """``wait_batch()``'s ``on_update``: a bar over request_counts on a terminal (tqdm), a line per change elsewhere."""

    def __init__(self, stream: TextIO | None = None) -> None:
        stream = stream or sys.stderr  # looked up now, not at import: the caller may have replaced it
        self._stream = stream
        self._last: tuple[str, int, int] | None = None
        self._bar = tqdm(total=0, file=stream, leave=True, unit="req") if stream.isatty() else None

    def __call__(self, batch: Batch) -> None:
        counts = batch.request_counts
        done, total = (counts.completed + counts.failed, counts.total) if counts else (0, 0)
        if self._bar is not None:
            self._bar.total = total
            self._bar.n = done
            self._bar.set_description_str(f"{batch.id} {batch.status.value:<11}", refresh=False)
            self._bar.refresh()
        elif (batch.status.value, done, total) != self._last:
            failed = counts.failed if counts else 0
            self._stream.write(f"{batch.id}  {batch.status.value:<11} {done}/{total} done, {failed} failed\n")
            self._stream.flush()
        self._last = (batch.status.value, done, total)

    def done(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _batch_id(value: str) -> str:
    if not re.match(BATCH_ID_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a batch id (batch_ and 32 hex digits)")
    return value


def _batch_lines(batch: Batch) -> list[str]:
    counts = batch.request_counts
    errors = batch.errors.data if batch.errors and batch.errors.data else []
    rows = [
        ("batch", batch.id),
        ("status", batch.status.value),
        ("model", batch.model),
        ("input", batch.input_file_id),
        ("requests", f"{counts.total} total, {counts.completed} completed, {counts.failed} failed" if counts else None),
        ("created", _epoch(batch.created_at)),
        ("expires", _epoch(batch.expires_at)),
        ("output", batch.output_file_id),
        ("errors", batch.error_file_id),
        ("metadata", ", ".join(f"{k}={v}" for k, v in (batch.metadata or {}).items()) or None),
    ]
    lines = [f"{name:<9} {value}" for name, value in rows if value]
    lines += [f"  line {e.line}: {e.code}: {e.message}" if e.line else f"  {e.code}: {e.message}" for e in errors]
    return lines


def _epoch(seconds: int | None) -> str | None:
    import datetime as dt

    return _when(dt.datetime.fromtimestamp(seconds, dt.UTC)) if seconds else None


def _batch_list_lines(page: Page[Batch]) -> list[str]:
    if not page.data:
        return ["no batches"]
    lines = [f"{'BATCH':<38}  {'STATUS':<11}  {'DONE':>13}  CREATED"]
    for b in page.data:
        counts = b.request_counts
        done = f"{counts.completed + counts.failed}/{counts.total}" if counts else ""
        lines.append(f"{b.id:<38}  {b.status.value:<11}  {done:>13}  {_epoch(b.created_at)}")
    if page.has_more:
        lines.append(f"more: {PROG} batch list --after {page.last_id}")
    return lines


def cmd_batch_submit(client: Client, args: argparse.Namespace) -> int:
    name = args.file
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}") from exc
    if not data.strip():
        raise CliError(f"{name} is empty; a batch input file holds one JSON request per line")
    uploaded = client.upload_file(data, filename=Path(name).name)
    batch = client.create_batch(uploaded.id, metadata=_metadata(args.metadata))
    if not args.wait:
        emit(args, batch, lambda: _batch_lines(batch))
        return EXIT_OK
    return _wait_batch(client, args, batch.id)


def _wait_batch(client: Client, args: argparse.Namespace, batch_id: str) -> int:
    progress = BatchProgress()
    try:
        batch = client.wait_batch(batch_id, timeout_s=args.timeout, on_update=progress)
    finally:
        progress.done()
    emit(args, batch, lambda: _batch_lines(batch))
    return EXIT_OK if batch.status.value == "completed" else EXIT_NO_RESULT


def cmd_batch_status(client: Client, args: argparse.Namespace) -> int:
    batch = client.get_batch(args.batch_id)
    emit(args, batch, lambda: _batch_lines(batch))
    return EXIT_OK


def cmd_batch_list(client: Client, args: argparse.Namespace) -> int:
    page = client.list_batches(after=args.after, limit=args.limit)
    emit(args, page, lambda: _batch_list_lines(page))
    return EXIT_OK


def cmd_batch_cancel(client: Client, args: argparse.Namespace) -> int:
    batch = client.cancel_batch(args.batch_id)
    emit(args, batch, lambda: _batch_lines(batch))
    return EXIT_OK


def cmd_batch_output(client: Client, args: argparse.Namespace) -> int:
    """The batch's output file (``--errors``: its error file), to stdout or ``--out``."""
    batch = client.get_batch(args.batch_id)
    file_id = batch.error_file_id if args.errors else batch.output_file_id
    if file_id is None:
        which = "error" if args.errors else "output"
        raise CliError(f"batch {batch.id} is {batch.status.value} and has no {which} file", EXIT_NO_RESULT)
    data = client.file_content(file_id)
    if args.out:
        Path(args.out).write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return EXIT_OK


# --- Parser and entry point -----------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (argparse's own prints the usage first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def common_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name."""
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    parser.add_argument("--api-url", default=default(None), help=f"the API's base URL (default: ${ENV_API_URL})")
    parser.add_argument("--api-key", default=default(None), help=f"the API key (default: ${ENV_API_KEY})")
    parser.add_argument(
        "--ws-url",
        default=default(None),
        help=f"the WebSocket API's URL, for --wait to be told instead of polling (default: ${ENV_WS_URL})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func: Callable[..., int], help_: str, parent: Any = sub) -> argparse.ArgumentParser:
        found: argparse.ArgumentParser = parent.add_parser(name, help=help_, description=help_)
        common_options(found, top=False)
        found.set_defaults(func=func)
        return found

    submit = command("submit", cmd_submit, "submit a job (inline, or --upload for the presigned-upload path)")
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", help="a chat.completions request body as JSON ('-' for stdin)")
    source.add_argument("--prompt", help="a single user message")
    submit.add_argument("--model", default="SmolLM2-135M-Instruct")
    submit.add_argument("--max-tokens", type=int)
    submit.add_argument("--temperature", type=float)
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--webhook", metavar="URL", help="https URL to notify when the job completes")
    submit.add_argument("--idempotency-key", help="the same key again returns the same job instead of a new one")
    submit.add_argument("--upload", action="store_true", help="send the body through a presigned S3 upload")
    submit.add_argument("--wait", action="store_true", help="wait for the job with a progress bar, print its answer")
    submit.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (600)")

    wait = command("wait", cmd_wait, "wait for a job with a progress bar, print its answer")
    wait.add_argument("job_id", type=_job_id)
    wait.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (600)")
    for name, func, help_ in (
        ("status", cmd_status, "a job's status"),
        ("result", cmd_result, "a job's answer"),
        ("cancel", cmd_cancel, "cancel a job"),
    ):
        command(name, func, help_).add_argument("job_id", type=_job_id)

    listing = command("list", cmd_list, "your jobs, newest first")
    listing.add_argument("--status", choices=[s.value for s in JobStatus])
    listing.add_argument("--limit", type=int)
    listing.add_argument("--next", metavar="TOKEN", help="the token the previous page ended with")

    batch = sub.add_parser("batch", help="OpenAI batches: submit a JSONL file of requests, follow it, fetch its output")
    batch_sub = batch.add_subparsers(dest="batch_command", required=True)
    submit_batch = command("submit", cmd_batch_submit, "upload FILE.jsonl and create a batch from it", parent=batch_sub)
    submit_batch.add_argument("file", metavar="FILE.jsonl", help="one request per line, in OpenAI's batch format")
    submit_batch.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit_batch.add_argument("--wait", action="store_true", help="wait with a progress bar until the batch is final")
    submit_batch.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds --wait waits (86400)")
    for name, func, help_ in (
        ("status", cmd_batch_status, "a batch's status and request counts"),
        ("cancel", cmd_batch_cancel, "cancel a batch (finished lines are kept)"),
    ):
        command(name, func, help_, parent=batch_sub).add_argument("batch_id", type=_batch_id)
    batch_list = command("list", cmd_batch_list, "your batches, newest first", parent=batch_sub)
    batch_list.add_argument("--limit", type=int)
    batch_list.add_argument("--after", metavar="BATCH_ID", help="the last id of the previous page")
    output = command("output", cmd_batch_output, "a batch's output file (JSONL)", parent=batch_sub)
    output.add_argument("batch_id", type=_batch_id)
    output.add_argument("--errors", action="store_true", help="the error file instead")
    output.add_argument("--out", "-o", metavar="FILE", help="write there instead of stdout")

    return parser


def _client(args: argparse.Namespace) -> Client:
    api_url = args.api_url or os.environ.get(ENV_API_URL)
    api_key = args.api_key or os.environ.get(ENV_API_KEY)
    if not api_url:
        raise CliError(f"no API URL: pass --api-url or set {ENV_API_URL} (the local stack's is http://127.0.0.1:8000)")
    if not api_key:
        raise CliError(f"no API key: pass --api-key or set {ENV_API_KEY}")
    return Client(api_url, api_key, ws_url=args.ws_url or os.environ.get(ENV_WS_URL) or "")


def _fail(prog: str, message: str, code: int) -> int:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return code


def guarded(command: Callable[[], int], *, prog: str = PROG) -> int:
    """Run ``command``; every failure becomes one line on stderr and its exit status, never a traceback."""
    try:
        return command()
    except CliError as exc:
        return _fail(prog, str(exc), exc.code)
    except WaitTimeout as exc:
        return _fail(prog, f"{exc}; it goes on: {PROG} wait {exc.job.job_id}", EXIT_WAIT_TIMEOUT)
    except BatchWaitTimeout as exc:
        return _fail(prog, f"{exc}; it goes on: {PROG} batch status {exc.batch.id}", EXIT_WAIT_TIMEOUT)
    except NoResult as exc:
        return _fail(prog, str(exc), EXIT_NO_RESULT)
    except ApiError as exc:
        return _fail(prog, f"the API refused the request: {exc}", EXIT_REFUSED)
    except UnexpectedResponse as exc:
        return _fail(prog, str(exc), EXIT_REFUSED)
    except ApiUnreachable as exc:
        return _fail(prog, f"{exc} (is the API URL right, and the API up?)", EXIT_UNREACHABLE)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # stdout closed early (| head): nothing left to say; silence the flush at exit too
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (left open for the interpreter's exit)
        return EXIT_OK
    except Exception as exc:  # a bug: still one line, never a traceback
        return _fail(prog, f"unexpected {type(exc).__name__}: {exc}", EXIT_BUG)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def command() -> int:
        with _client(args) as client:
            return int(args.func(client, args))

    return guarded(command)


def run() -> None:
    """The ``async-inference`` command."""
    sys.exit(main())


if __name__ == "__main__":
    run()
