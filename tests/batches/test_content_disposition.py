"""A file's name in the Content-Disposition of its presigned GET (RFC 6266, RFC 5987)."""

from __future__ import annotations

import pytest

from async_inference.batches.aws import content_disposition


@pytest.mark.parametrize(
    ("name", "fallback", "encoded"),
    [
        ('a"; filename="evil.html', "a__ filename__evil.html", "a%22%3B%20filename%3D%22evil.html"),
        ("résumé.jsonl", "r_sum_.jsonl", "r%C3%A9sum%C3%A9.jsonl"),
        ("in.jsonl", "in.jsonl", "in.jsonl"),
    ],
)
def test_a_filename_is_one_parameter_quoted_safely_and_itself_encoded(name, fallback, encoded):
    # WHEN a file's name goes into its Content-Disposition
    header = content_disposition(name)
    # THEN the quoted fallback holds no quote or separator, and filename* holds the name itself
    assert header == f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
