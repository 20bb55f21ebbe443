"""The door's rules for ``pattern`` (``async_inference.schema_patterns``) against xgrammar itself: a pattern the door
takes compiles without a word from xgrammar, and one it refuses is one xgrammar refuses or compiles wrong (it warns
that it ignores a lookahead or reads an escape as its letter)."""

from __future__ import annotations

import json

import pytest

from async_inference.schema_patterns import unsupported_feature
from tests.conformance.openai_reference import chat_samples

xgrammar = pytest.importorskip("xgrammar")

TAKEN = [
    r"^[a-z]+$",
    r"\d{3}-\d{4}",
    r"[\w.]+@[\w]+\.com",
    r"(?:ab)+",
    r"(?i)abc",
    r"(?<year>\d{4})",
    r"(?P<year>\d{4})",
    r"a{2,}",
    r"[^\s]+",
    r"\x41\u00e9\cJ\0",
    r"[\b]",
    r"\$\(\)\[\\",
    r"[\]a-]",
    r"^(N|S|E|W)$",
]
REFUSED = [
    r"\b(N|S|E|W)\b",  # the corpus's one pattern (line 115)
    r"\Bfoo",
    r"(?=a)b",
    r"(?!a)b",
    r"(?<=a)b",
    r"(?<!a)b",
    r"(a)\1",
    r"(?<x>a)\k<x>",
    r"\p{L}+",
    r"[\p{L}]",
    r"\Aabc\Z",
    r"abc\z",
    r"\Qa.b\E",
    r"(?P<x>a)(?P=x)",
    r"(?>ab)",
    r"(?m)^a",
    r"a{,3}",
    r"[\1]",
]


def xgrammar_objection(pattern: str, capfd) -> str | None:
    """What xgrammar says compiling a string schema with ``pattern``: its error, its warnings (written to the
    process's stderr by its C++ code) other than about anchors (a pattern is matched whole), or None."""
    capfd.readouterr()
    try:
        xgrammar.Grammar.from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
    except Exception as exc:  # xgrammar raises RuntimeError from C++; any error is an objection
        return f"error: {exc}"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "Warning" in line and "Anchor" not in line]
    return "; ".join(warnings) or None


@pytest.mark.parametrize("pattern", TAKEN)
def test_a_pattern_the_door_takes_compiles_cleanly_in_xgrammar(pattern, capfd):
    assert unsupported_feature(pattern) is None
    assert xgrammar_objection(pattern, capfd) is None


@pytest.mark.parametrize("pattern", REFUSED)
def test_a_pattern_the_door_refuses_is_one_xgrammar_refuses_or_compiles_wrong(pattern, capfd):
    assert unsupported_feature(pattern) is not None
    assert xgrammar_objection(pattern, capfd) is not None


def test_the_door_and_xgrammar_agree_on_every_pattern_of_the_corpus(capfd):
    def patterns(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    yield value
                else:
                    yield from patterns(value)
        elif isinstance(node, list):
            for item in node:
                yield from patterns(item)

    found = {p for sample in chat_samples("m") for p in patterns(sample.body)}
    assert found, "the corpus has patterns"
    assert {p: unsupported_feature(p) is None for p in found} == {
        p: xgrammar_objection(p, capfd) is None for p in found
    }
