"""``async-inference batch submit|status|list|cancel|output`` and the SDK's batch methods against the local stack."""

from __future__ import annotations

import json
import time

import pytest

from async_inference import settings
from async_inference_client import Client
from async_inference_client.cli import EXIT_NO_RESULT, EXIT_OK, EXIT_USAGE, main
from tests.e2e.conftest import TENANT_KEYS

pytestmark = pytest.mark.e2e
KEY_A = list(TENANT_KEYS)[0]


def rows(n: int, prefix: str = "cli") -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"{prefix}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]},
            }
        ).encode()
        + b"\n"
        for i in range(n)
    )


@pytest.fixture
def cli(stack, capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["--api-url", stack.api_url, "--api-key", KEY_A, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_submit_status_list_cancel_and_output(cli, tmp_path):
    source = tmp_path / "requests.jsonl"
    source.write_bytes(rows(3))
    # WHEN a JSONL file is submitted THEN a batch is created from it and printed as the API's object
    code, out, _ = cli("batch", "submit", str(source), "--json", "--metadata", "team=cli")
    assert code == EXIT_OK
    batch = json.loads(out)
    assert batch["object"] == "batch" and batch["metadata"] == {"team": "cli"}
    deadline = time.monotonic() + 30
    while json.loads(cli("batch", "status", batch["id"], "--json")[1])["status"] == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    code, out, _ = cli("batch", "status", batch["id"])
    assert code == EXIT_OK and "3 total, 0 completed, 0 failed" in out
    code, out, _ = cli("batch", "list", "--limit", "50")
    assert code == EXIT_OK and batch["id"] in out
    code, out, _ = cli("batch", "cancel", batch["id"], "--json")
    assert code == EXIT_OK and json.loads(out)["status"] == "cancelling"
    # a batch with no output file yet: one line and exit 1
    code, out, err = cli("batch", "output", batch["id"])
    assert code == EXIT_NO_RESULT and "has no output file" in err and len(err.strip().splitlines()) == 1


def test_a_failed_batch_is_waited_for_and_ends_with_exit_1_and_its_errors(cli, tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_bytes(rows(2) + b"{not json\n")
    code, out, err = cli("batch", "submit", str(source), "--wait", "--timeout", "60")
    assert code == EXIT_NO_RESULT
    assert "failed" in out and "line 3: invalid_json_line" in out
    assert "failed" in err  # the progress lines (stderr is not a terminal here)


def test_an_unreadable_or_empty_file_is_a_usage_error(cli, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    assert cli("batch", "submit", str(empty))[0] == EXIT_USAGE
    assert cli("batch", "submit", str(tmp_path / "missing.jsonl"))[0] == EXIT_USAGE


def test_the_sdk_uploads_a_large_file_through_the_presigned_path_and_reads_it_back(stack):
    # GIVEN a file over the inline limit WHEN the SDK uploads it THEN it goes through the presigned PUT and its content
    # reads back byte for byte (the redirect followed without the API key)
    line = json.dumps(
        {
            "custom_id": "x" * 40,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "echo-model", "messages": [{"role": "user", "content": "y" * 2000}]},
        }
    ).encode()
    data = (line + b"\n") * (settings.MAX_FILE_INLINE_BYTES // len(line) + 10)
    with Client(stack.api_url, KEY_A) as client:
        uploaded = client.upload_file(data, filename="large.jsonl")
        assert uploaded.bytes == len(data) and uploaded.status == "processed"
        assert client.file_content(uploaded.id) == data
