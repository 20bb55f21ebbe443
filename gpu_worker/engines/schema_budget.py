"""What a JSON schema may cost the engine's grammar compiler, checked before it is compiled.

A grammar is compiled once per schema (xgrammar, in both engines), and its cost grows with the schema: a 90 KB schema
of 1,600 ``anyOf`` branches, each a ``pattern``, took seconds of CPU and 1.4 GB of memory to compile, while every other
tenant's request waited. The API refuses such a schema at submission; the worker checks again here, because a job
reaches it by other ways too (an uploaded prompt, a batch line, a forced tool's ``parameters``), and its checks must
not depend on the API's version. A schema over a limit fails its job (never a retry), the message naming the field,
the measure and the limit.

What is measured (``SchemaCost``): the schema's JSON size, its nesting depth (of objects and arrays), its alternatives
(the branches of ``anyOf`` / ``oneOf`` / ``allOf`` and the values of ``enum``), and its ``pattern`` expressions (each
compiles to an automaton). The limits leave ordinary schemas, tool signatures included, far below them: OpenAI's own
structured outputs allow 5,000 properties, 10 levels of nesting and 1,000 enum values in a schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpu_worker.engines.base import PermanentEngineError

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64  # JSON levels: each level of a schema's nesting is two (``properties``, then the schema)
MAX_SCHEMA_ALTERNATIVES = 1_000
MAX_SCHEMA_PATTERNS = 64
_ALTERNATIVES = ("anyOf", "oneOf", "allOf", "enum")


@dataclass(frozen=True)
class SchemaCost:
    """The measures of one schema that its compile cost grows with."""

    bytes: int
    depth: int
    alternatives: int
    patterns: int

    @classmethod
    def of(cls, schema: Any) -> SchemaCost:
        depth = alternatives = patterns = 0
        for node, level in _nodes(schema):
            depth = max(depth, level)
            if isinstance(node, dict):
                alternatives += sum(len(node[k]) for k in _ALTERNATIVES if isinstance(node.get(k), list))
                patterns += isinstance(node.get("pattern"), str)
        return cls(len(json.dumps(schema)), depth, alternatives, patterns)

    def over(self) -> str | None:
        """What exceeds its limit (the first found), or None."""
        for measure, value, limit in (
            ("is {} bytes of JSON", self.bytes, MAX_SCHEMA_BYTES),
            ("nests {} levels deep", self.depth, MAX_SCHEMA_DEPTH),
            ("has {} alternatives (anyOf, oneOf, allOf branches and enum values)", self.alternatives,
             MAX_SCHEMA_ALTERNATIVES),
            ("has {} pattern expressions", self.patterns, MAX_SCHEMA_PATTERNS),
        ):  # fmt: skip
            if value > limit:
                return f"{measure.format(value)}, over this deployment's limit of {limit}"
        return None


def _nodes(value: Any) -> Iterator[tuple[Any, int]]:
    """Every object and array in ``value`` with its depth (the top is 1)."""
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            yield node, level
            stack.extend((child, level + 1) for child in node.values() if isinstance(child, (dict, list)))
        elif isinstance(node, list):
            yield node, level
            stack.extend((child, level + 1) for child in node if isinstance(child, (dict, list)))


def check_schema(schema: dict[str, Any], field: str) -> None:
    """Refuse ``schema`` (given as ``field`` of the request) when it exceeds a limit, before anything compiles it."""
    over = SchemaCost.of(schema).over()
    if over is not None:
        raise PermanentEngineError(
            f"{field}: the schema {over}; simplify it (fewer alternatives or patterns, less nesting)"
        )
