"""Planning a batch input file: structural errors name their lines, chunks cover the lines byte for byte."""

from __future__ import annotations

import json

import pytest

from async_inference.batches.planning import plan
from async_inference.served_models import ServedModels

SERVED = ServedModels.of(["m"])


def line(custom_id: str, **changes) -> dict:
    request = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": custom_id}]},
    }
    request.update(changes)
    return request


def jsonl(*rows, end: bytes = b"\n") -> bytes:
    return end.join(r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows) + end


@pytest.mark.parametrize(
    ("data", "code", "at"),
    [
        (jsonl(line("a"), b"{oops"), "invalid_json_line", 2),
        (jsonl(line("a"), b"[1, 2]"), "invalid_json_line", 2),
        (jsonl(line("a"), b"", line("b")), "invalid_json_line", 2),
        (jsonl({k: v for k, v in line("a").items() if k != "custom_id"}), "missing_required_parameter", 1),
        (jsonl(line("a"), line("")), "missing_required_parameter", 2),
        (jsonl(line("a"), line("b"), line("a")), "duplicate_custom_id", 3),
        (jsonl(line("a", url="/v1/completions")), "invalid_url", 1),
        (jsonl(line("a"), line("b", method="PUT")), "invalid_method", 2),
        (jsonl(line("a", body="hello")), "missing_required_parameter", 1),
        (jsonl(line("a"), line("b", body={"model": "other", "messages": []})), "model_not_found", 2),
    ],
)
def test_each_structural_error_names_its_line(data, code, at):
    found = plan([data], served=SERVED)
    assert [(e.code, e.line) for e in found.errors] == [(code, at)]
    assert found.chunks == []  # nothing runs


def test_a_second_model_is_a_structural_error():
    served = ServedModels.of(["m", "n"])
    found = plan([jsonl(line("a"), line("b", body={"model": "n"}))], served=served)
    assert [(e.code, e.line) for e in found.errors] == [("mismatched_model", 2)]


def test_more_lines_than_the_limit_fail_at_the_first_line_over():
    found = plan([jsonl(*[line(str(i)) for i in range(6)])], served=SERVED, max_lines=5)
    assert [(e.code, e.line) for e in found.errors] == [("too_many_requests", 6)]


def test_an_empty_file_fails():
    assert [e.code for e in plan([b""], served=SERVED).errors] == ["empty_file"]


def test_a_body_the_schema_would_refuse_is_not_structural():
    # max_tokens 0 and no messages: the worker answers that line with a 400 in the error file
    found = plan(
        [jsonl(line("a", body={"model": "m", "max_tokens": 0}), line("b", body={"messages": []}))], served=SERVED
    )
    assert found.ok and found.total == 2


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
@pytest.mark.parametrize("split", [1, 7, 4096])
def test_chunks_cover_every_line_byte_for_byte_whatever_the_read_sizes(end, split):
    rows = [line(f"id-{i}") for i in range(23)]
    data = jsonl(*rows, end=end)
    pieces = [data[i : i + split] for i in range(0, len(data), split)]
    found = plan(pieces, served=SERVED, chunk_lines=10)
    assert found.ok and found.total == 23 and found.model == "m"
    assert [(c.first_line, c.line_count) for c in found.chunks] == [(1, 10), (11, 10), (21, 3)]
    for chunk in found.chunks:
        text = data[chunk.start_byte : chunk.end_byte + 1]  # an HTTP Range, inclusive
        ids = [json.loads(r)["custom_id"] for r in text.splitlines()]
        assert ids == [f"id-{i}" for i in range(chunk.first_line - 1, chunk.first_line - 1 + chunk.line_count)]


def test_a_last_line_without_a_newline_and_trailing_blank_lines_count_right():
    data = jsonl(line("a"), line("b")) + b"\n\n" + json.dumps(line("c")).encode()
    found = plan([data], served=SERVED)
    # a blank line before a line with content is an error; trailing ones are not
    assert [(e.code, e.line) for e in found.errors] == [("invalid_json_line", 3)]
    found = plan([jsonl(line("a"), line("b")) + b"\n\n"], served=SERVED)
    assert found.ok and found.total == 2


def test_any_name_is_served_with_the_wildcard():
    found = plan([jsonl(line("a", body={"model": "whatever"}))], served=ServedModels.of(["*"]))
    assert found.ok and found.model == "whatever"
