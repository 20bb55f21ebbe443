"""The Files API's multipart body, as the openai SDK's HTTP client builds it."""

from __future__ import annotations

import httpx2
import pytest

from async_inference.batches.multipart import MultipartError, parse_file_form


def sdk_body(files: dict, data: dict) -> tuple[str, bytes]:
    request = httpx2.Request("POST", "http://api/v1/files", files=files, data=data)
    return request.headers["content-type"], request.read()


def test_file_and_purpose_come_back_byte_for_byte_binary_included():
    payload = b'{"custom_id": "a"}\r\n\xff\xfe\x00 tail'
    form = parse_file_form(*sdk_body({"file": ("in.jsonl", payload, "application/jsonl")}, {"purpose": "batch"}))
    assert (form.filename, form.data, form.purpose) == ("in.jsonl", payload, "batch")


@pytest.mark.parametrize(
    ("files", "data", "field"),
    [
        ({}, {"purpose": "batch"}, "file"),
        ({"file": ("in.jsonl", b"x")}, {}, "purpose"),
    ],
)
def test_a_missing_part_names_it(files, data, field):
    content_type, body = sdk_body(files or {"other": ("x", b"y")}, data)
    with pytest.raises(MultipartError, match=f"^{field}:"):
        parse_file_form(content_type, body)


def test_a_json_body_is_refused_with_what_to_send():
    with pytest.raises(MultipartError, match="multipart/form-data"):
        parse_file_form("application/json", b"{}")
