"""Planning a batch: its input file read once, as a stream, into structural errors or chunks of lines.

A structural error (a line that is not a JSON object, a missing or duplicate ``custom_id``, a ``url`` other than the
endpoint, a method other than POST, more than ``settings.BATCH_MAX_LINES`` lines, a model not served, or a second
model) fails the batch, and nothing runs. A ``body`` the request schema refuses is not structural: the worker writes
that line to the error file as a 400 with the jobs API's message. No AWS here: the caller hands in the bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pydantic import ValidationError

from async_inference import safe_json, settings
from async_inference.batches.lines import BatchInputLine, line_errors
from async_inference.batches.models import BatchError, ChunkRange
from async_inference.limits import clip
from async_inference.served_models import ServedModels


@dataclass
class Plan:
    """What planning found: errors (the batch fails), or the line count, the model and the chunks."""

    errors: list[BatchError] = field(default_factory=list)
    total: int = 0
    model: str | None = None
    chunks: list[ChunkRange] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class _Line:
    number: int  # 1-based
    start: int  # first byte
    end: int  # last byte of the content, inclusive (the terminator excluded)
    text: bytes


def _lines(chunks: Iterable[bytes]) -> Iterator[_Line]:
    """The lines of a byte stream with their byte ranges; a final line without a terminator counts."""
    buffer, offset, number = b"", 0, 0
    for chunk in chunks:
        buffer += chunk
        while (cut := buffer.find(b"\n")) >= 0:
            raw, buffer = buffer[:cut], buffer[cut + 1 :]
            content = raw[:-1] if raw.endswith(b"\r") else raw
            number += 1
            yield _Line(number, offset, offset + len(content) - 1, content)
            offset += cut + 1
    if buffer:
        number += 1
        yield _Line(number, offset, offset + len(buffer) - 1, buffer)


def plan(
    chunks: Iterable[bytes],
    *,
    served: ServedModels,
    endpoint: str = settings.BATCH_ENDPOINT,
    chunk_lines: int = settings.BATCH_CHUNK_LINES,
    max_lines: int = settings.BATCH_MAX_LINES,
    max_errors: int = settings.BATCH_MAX_ERRORS,
) -> Plan:
    """Validate a batch input file (JSONL in OpenAI's format) and cut it into chunks of ``chunk_lines`` lines."""
    result = Plan()
    seen: set[str] = set()
    current: list[_Line] = []

    def error(code: str, message: str, line: int | None, param: str | None = None) -> None:
        if len(result.errors) < max_errors:
            # Clipped: a message quotes the line, and the batch record holding max_errors of them must fit DynamoDB.
            result.errors.append(BatchError(code=code, message=clip(message), line=line, param=param))

    def close_chunk() -> None:
        if current:
            result.chunks.append(
                ChunkRange(
                    start_byte=current[0].start,
                    end_byte=current[-1].end,
                    first_line=current[0].number,
                    line_count=len(current),
                )
            )
            current.clear()

    blank: _Line | None = None
    for line in _lines(chunks):
        if not line.text.strip():
            blank = blank or line  # an error only if a line with content follows (trailing blank lines are fine)
            continue
        if blank is not None:
            error("invalid_json_line", f"line {blank.number} is empty; every line must be a JSON object", blank.number)
            blank = None
        result.total += 1
        if result.total > max_lines:
            error(
                "too_many_requests",
                f"the file has more than {max_lines} lines, the most one batch may hold",
                line.number,
            )
            break
        _check_line(line, seen, served, endpoint, result, error)
        if len(result.errors) >= max_errors:
            break
        current.append(line)
        if len(current) == chunk_lines:
            close_chunk()
    close_chunk()
    if result.total == 0 and not result.errors:
        error("empty_file", "the input file has no lines", None)
    if result.errors:
        result.chunks = []
    return result


# What a line whose structure BatchInputLine refuses is told, by the field at fault.
_STRUCTURE_ERRORS = {
    "custom_id": ("missing_required_parameter", "custom_id is missing or not a non-empty string"),
    "method": ("invalid_method", "method must be POST, got {got}"),
    "url": ("invalid_url", "url must be {endpoint}, the batch's endpoint, got {got}"),
    "body": ("missing_required_parameter", "body is missing or not a JSON object"),
}


def _shown(value: object) -> str:
    """A value of the line as an error quotes it: its repr, clipped (a 420 KB method is quoted by its start)."""
    return clip(repr(value), 200)


def _check_line(line: _Line, seen: set[str], served: ServedModels, endpoint: str, result: Plan, error) -> None:  # noqa: ANN001
    n = line.number
    try:
        request = safe_json.loads(line.text)
    except safe_json.UnsafeJson as exc:
        error(
            "invalid_json_line",
            f"line {n} is not valid JSON" if exc.msg.startswith("not valid") else f"line {n}: {exc}",
            n,
        )
        return
    if not isinstance(request, dict):
        error("invalid_json_line", f"line {n} is a JSON {type(request).__name__}, not an object", n)
        return
    try:
        parsed = BatchInputLine.model_validate(request, context={"endpoint": endpoint})
    except ValidationError as exc:
        for name, got in line_errors(exc).items():
            code, message = _STRUCTURE_ERRORS[name]
            error(code, f"line {n}: " + message.format(got=_shown(got), endpoint=endpoint), n, name)
        return
    if parsed.custom_id in seen:
        error(
            "duplicate_custom_id",
            f"line {n}: custom_id {_shown(parsed.custom_id)} is used by an earlier line",
            n,
            "custom_id",
        )
    else:
        seen.add(parsed.custom_id)
    model = parsed.body.get("model")
    if not isinstance(model, str):
        return  # the worker refuses the body with the jobs API's message, as a line of the error file
    if not served.serves(model):
        error("model_not_found", f"line {n}: {served.not_found_message(clip(model, 256))}", n, "body.model")
    elif result.model is None:
        result.model = model
    elif model != result.model:
        error(
            "mismatched_model",
            f"line {n}: model {_shown(model)} differs from {_shown(result.model)} of the earlier lines; a batch runs one "
            "model",
            n,
            "body.model",
        )
