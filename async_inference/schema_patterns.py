"""The ``pattern`` regular expressions in a request's JSON schemas that the engines' grammar library cannot honour.

Both engines constrain structured outputs and forced tool calls with xgrammar (0.2.8), which compiles a schema's
``pattern`` into its grammar. Some regular-expression features it refuses (the job would fail once a worker compiles
it), and some it compiles wrong: it ignores lookaheads and reads unknown escapes as the letter itself, so the output
would not match the pattern it was asked to match. A schema using any of them is refused at the door, naming the
pattern, with what to write instead. What is checked (``unsupported_feature``):

- word boundaries ``\\b``, ``\\B`` (outside a character class);
- lookaheads ``(?=``, ``(?!`` and lookbehinds ``(?<=``, ``(?<!``; any other ``(?`` group than ``(?:``, ``(?<name>``
  ``(?P<name>`` and the case flag ``(?i)``;
- backreferences ``\\1``-``\\9``, ``\\k<name>``; Unicode property classes ``\\p{...}``, ``\\P{...}``;
- any other letter escape than ``\\d \\D \\w \\W \\s \\S \\t \\n \\r \\f \\v \\0 \\cX \\xHH \\uHHHH`` (``\\A``,
  ``\\Z``, ``\\z``, ``\\G``, ``\\K``, ``\\Q``...: other regex dialects');
- the repetition ``{,n}`` (write ``{0,n}``).

A pattern is matched whole by the grammar, as if between ``^`` and ``$``, which is one of the strings the schema's
(unanchored) pattern matches. No xgrammar import: this runs in the API's functions; the engine tests check these rules
against xgrammar itself (``tests/engines/test_schema_patterns.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_ESCAPES = set("dDwWsStnrfv0cxu")  # letter escapes xgrammar reads as ECMA-262 does
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)


def unsupported_feature(pattern: str) -> str | None:
    """What in ``pattern`` the grammar library cannot honour (with what to do instead), or None."""
    i, in_class = 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            if not escaped.isalnum() or escaped in _ESCAPES or (in_class and escaped == "b"):  # [\b]: backspace
                i += 2
                continue
            if in_class:
                return f"the escape \\{escaped} is not supported in a character class: list the characters"
            if escaped in "bB":
                return f"the word boundary \\{escaped} is not supported: match the words themselves"
            if escaped in "123456789" or escaped == "k":
                return "backreferences (\\1, \\k<name>) are not supported: repeat the group's pattern instead"
            if escaped in "pP":
                return f"Unicode property classes (\\{escaped}{{...}}) are not supported: list the characters in [...]"
            return f"the escape \\{escaped} is not supported (ECMA-262 regular expressions, as JSON Schema says)"
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":  # a leading ] is a literal
                i += 1
        elif char == "(" and pattern[i + 1 : i + 2] == "?":
            group = pattern[i + 2 : i + 4]
            if group[:1] in ("=", "!"):
                return "lookaheads ((?=...), (?!...)) are not supported: write the pattern without them"
            if group in ("<=", "<!"):
                return "lookbehinds ((?<=...), (?<!...)) are not supported: write the pattern without them"
            if not (group[:1] in (":", "<") or group in ("P<", "i)")):
                return f"the group syntax {pattern[i : i + 4]!r} is not supported: use (...), (?:...) or (?<name>...)"
        elif char == "{" and pattern[i + 1 : i + 2] == ",":
            return "the repetition {,n} is not supported: write {0,n}"
        i += 1
    return None


def _subschemas(schema: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            yield from ((f"{key}.{name}", sub) for name, sub in schema[key].items())
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            yield from ((f"{key}.{i}", sub) for i, sub in enumerate(schema[key]))
    for key in _SCHEMA_ONE:
        value = schema.get(key)
        if isinstance(value, list):  # items as a list: the older tuple form
            yield from ((f"{key}.{i}", sub) for i, sub in enumerate(value))
        elif value is not None:
            yield key, value


def unsupported_patterns(schema: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Each pattern in ``schema`` (a JSON schema, walked through its subschemas only, so that a property named
    "pattern" or a default value is not taken for one) the grammar cannot honour: its dotted path and why."""
    if not isinstance(schema, dict):
        return
    prefix = f"{path}." if path else ""
    if isinstance(schema.get("pattern"), str) and (why := unsupported_feature(schema["pattern"])):
        yield f"{prefix}pattern", why
    regexes = schema.get("patternProperties")
    for regex in regexes if isinstance(regexes, dict) else ():
        if why := unsupported_feature(regex):
            yield f"{prefix}patternProperties.{regex}", why
    for where, sub in _subschemas(schema):
        yield from unsupported_patterns(sub, f"{prefix}{where}")
