"""The one JSON loader for what callers send: request bodies, uploaded requests, batch input lines.

Python's ``json`` fails on hostile input with errors nobody catches: a body nested 50,000 deep raises RecursionError,
an integer of 5,000 digits a ValueError from ``int()``. This loader parses with pydantic-core's parser (Rust, no
recursion into the interpreter, its own nesting cap of 200), then holds the result to two limits of its own, so that
every entry point refuses the same things with the same message:

* ``MAX_DEPTH`` levels of arrays and objects (a chat request with tools and JSON schemas needs well under 20);
* ``MAX_NUMBER_DIGITS`` digits in an integer (int64 needs 19), and no NaN, Infinity or float beyond a double's range.

``UnsafeJson`` is a ``json.JSONDecodeError``: code that already turns a decode error into a 4xx (Powertools'
validation middleware, ``except ValueError``) turns these into the same 4xx.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pydantic_core

MAX_DEPTH = 64
MAX_NUMBER_DIGITS = 100
_NUMBER_LIMIT = 10**MAX_NUMBER_DIGITS
DEPTH_MESSAGE = f"JSON nested deeper than {MAX_DEPTH} levels"
NUMBER_MESSAGE = f"a JSON number of more than {MAX_NUMBER_DIGITS} digits"


class UnsafeJson(json.JSONDecodeError):
    """Input this loader refuses; ``msg`` says what is wrong (and where, for the limits), for a client to fix."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg, "", 0)

    def __str__(self) -> str:
        return self.msg


def loads(data: str | bytes | bytearray) -> Any:
    """The value ``data`` holds; UnsafeJson when it is not JSON, nests deeper than ``MAX_DEPTH`` or holds an
    integer over ``MAX_NUMBER_DIGITS`` digits, NaN, Infinity or a float a double cannot hold."""
    try:
        value = pydantic_core.from_json(data, allow_inf_nan=False)
    except TypeError:  # a str that is not encodable as UTF-8 (a lone surrogate)
        raise UnsafeJson("not valid JSON: the text is not UTF-8") from None
    except ValueError as exc:
        reason = str(exc)
        if reason.startswith("recursion limit exceeded"):
            raise UnsafeJson(DEPTH_MESSAGE) from None
        if reason.startswith("number out of range"):
            raise UnsafeJson(NUMBER_MESSAGE) from None
        raise UnsafeJson(f"not valid JSON: {reason}") from None
    check(value)
    return value


def check(value: Any) -> None:
    """UnsafeJson when a parsed value breaks the limits; the message names where (``a.b[2]``)."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, dict):
            if depth + 1 > MAX_DEPTH:
                raise UnsafeJson(f"{DEPTH_MESSAGE} (at {_short(path)})")
            stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            if depth + 1 > MAX_DEPTH:
                raise UnsafeJson(f"{DEPTH_MESSAGE} (at {_short(path)})")
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(item))
        elif isinstance(item, int) and not isinstance(item, bool) and not -_NUMBER_LIMIT < item < _NUMBER_LIMIT:
            raise UnsafeJson(f"{NUMBER_MESSAGE} (at {_short(path)})")
        elif isinstance(item, float) and not math.isfinite(item):  # 1e400: the parser makes it inf
            raise UnsafeJson(f"a JSON number beyond the range of a double (at {_short(path)})")


def _short(path: str, limit: int = 120) -> str:
    if not path:
        return "the top"
    return path if len(path) <= limit else "..." + path[-limit:].lstrip(".")
