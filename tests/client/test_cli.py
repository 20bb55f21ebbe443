"""The CLI as a person runs it (a subprocess): each failure is one line on stderr with its exit status, never a
traceback; --upload keeps --webhook and --idempotency-key; text by default, JSON with --json."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from local_runtime.moto_server import free_port
from tests.client.conftest import CliRun, run_cli
from tests.faults.fault_stack import FaultStack

UNKNOWN_JOB = "job_" + uuid.uuid4().hex
# Nothing listens here: the commands below fail on their input before they would connect.
NOWHERE = ["--api-url", f"http://127.0.0.1:{free_port()}", "--api-key", "any-key-0123456789abcdef"]


def one_line_error(done: subprocess.CompletedProcess[str], code: int, *says: str, after_progress: bool = False) -> str:
    """The one line the command printed on stderr, after checking its exit status and that it is one line (after the
    progress lines of a wait, off a terminal one per status: "job_...  queued  0.1 s")."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    if after_progress:
        assert lines and all(line.startswith("job_") for line in lines[:-1]), done.stderr
        lines = lines[-1:]
    assert len(lines) == 1, done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)
    assert lines[0].startswith("async-inference"), lines[0]
    for text in says:
        assert text in lines[0], lines[0]
    return lines[0]


# --- Input the CLI refuses before it calls the API ------------------------------------------------------------------


def test_metadata_that_is_not_key_value_is_refused_in_one_line():
    done = run_cli(*NOWHERE, "submit", "--prompt", "hi", "--metadata", "team=search", "--metadata", "foo")
    one_line_error(done, 2, "--metadata 'foo' is not KEY=VALUE")


def test_a_request_file_that_is_not_json_is_refused_in_one_line(tmp_path):
    request = tmp_path / "request.json"
    request.write_text("model: m\nmessages: []\n")
    done = run_cli(*NOWHERE, "submit", "--file", str(request))
    one_line_error(done, 2, f"--file {request} is not JSON")


def test_a_request_file_that_is_not_an_object_is_refused_in_one_line(tmp_path):
    request = tmp_path / "request.json"
    request.write_text('["a list"]')
    one_line_error(run_cli(*NOWHERE, "submit", "--file", str(request), "--upload"), 2, "must be an object")


def test_a_missing_request_file_is_refused_in_one_line(tmp_path):
    done = run_cli(*NOWHERE, "submit", "--file", str(tmp_path / "absent.json"))
    one_line_error(done, 2, "cannot read --file", "No such file or directory")


def test_without_an_api_url_the_cli_says_so_instead_of_using_a_default():
    # GIVEN neither --api-url nor ASYNC_INFERENCE_API_URL
    done = run_cli("--api-key", "any-key-0123456789abcdef", "status", UNKNOWN_JOB)
    # THEN it names both ways to give one, and calls nothing
    one_line_error(done, 2, "no API URL", "--api-url", "ASYNC_INFERENCE_API_URL")


def test_a_malformed_job_id_is_refused_in_one_line_without_the_usage():
    one_line_error(run_cli(*NOWHERE, "status", "12345"), 2, "'12345' is not a job id")


def test_an_unreachable_api_is_one_line_naming_the_url_and_exit_4():
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli("--api-url", url, "--api-key", "any-key-0123456789abcdef", "status", UNKNOWN_JOB)
    one_line_error(done, 4, f"cannot reach {url}/v1/jobs/{UNKNOWN_JOB}", "Connection refused")


# --- Against the local stack ----------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_wait_that_times_out_is_one_line_saying_the_job_goes_on_and_exit_5(on_stack: CliRun):
    # GIVEN a stack with no worker, so a job stays queued
    # WHEN a person submits and waits 2 s
    done = on_stack("submit", "--prompt", "nobody runs me", "--wait", "--timeout", "2")
    # THEN one line says the job is still queued and how to wait again
    line = one_line_error(
        done, 5, "is still queued after 2 s", "it goes on: async-inference wait job_", after_progress=True
    )
    job_id = line.split("async-inference wait ")[1].strip()
    # AND the job is indeed still there
    assert json.loads(on_stack("status", job_id, "--json").stdout)["status"] == "queued"
    on_stack("cancel", job_id)


@pytest.mark.e2e
def test_an_api_error_is_one_line_with_the_apis_code_and_message_and_exit_3(on_stack: CliRun):
    done = on_stack("status", UNKNOWN_JOB)
    one_line_error(done, 3, "HTTP 404 not_found")


@pytest.mark.e2e
def test_an_upload_keeps_its_webhook_and_idempotency_key(on_stack: CliRun, tmp_path):
    # GIVEN a request body in a file
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": "m", "messages": [{"role": "user", "content": "by upload"}]}))
    key = f"upload-{uuid.uuid4().hex}"
    hook = "http://127.0.0.1:9/hook"  # the local stack allows loopback webhooks; nothing runs this job
    args = ["submit", "--file", str(request), "--upload", "--webhook", hook, "--idempotency-key", key, "--json"]
    # WHEN a person submits it through the presigned upload with a webhook and an idempotency key, twice
    first, second = on_stack(*args), on_stack(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    job = json.loads(first.stdout)
    # THEN the job has the webhook, and the retry with the same key is the same job
    assert job["webhook"]["url"] == hook
    assert json.loads(second.stdout)["job_id"] == job["job_id"]
    assert json.loads(on_stack("status", job["job_id"], "--json").stdout)["webhook"]["url"] == hook
    on_stack("cancel", job["job_id"])


@pytest.mark.e2e
def test_status_is_text_for_people_and_json_with_the_flag(on_stack: CliRun):
    submitted = json.loads(on_stack("submit", "--prompt", "look at me", "--metadata", "team=docs", "--json").stdout)
    job_id = submitted["job_id"]
    text = on_stack("status", job_id)
    as_json = on_stack("--json", "status", job_id)
    assert text.returncode == 0 and as_json.returncode == 0
    assert f"job       {job_id}" in text.stdout.splitlines()
    assert "status    queued" in text.stdout.splitlines() and "metadata  team=docs" in text.stdout.splitlines()
    assert json.loads(as_json.stdout)["metadata"] == {"team": "docs"}
    on_stack("cancel", job_id)


@pytest.mark.e2e
def test_submit_wait_prints_the_answer_with_progress_on_stderr(cli_stack: FaultStack, on_stack: CliRun):
    # GIVEN a worker (echo engine: the answer is the prompt)
    worker = cli_stack.start_worker("cli")
    try:
        # WHEN a person submits and waits
        done = on_stack("submit", "--prompt", "echo me back", "--wait", "--timeout", "60", timeout_s=90)
    finally:
        worker.kill()
        worker.wait()
    # THEN stdout is the answer alone, and stderr followed the job (one line per status, off a terminal)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "echo me back\n"
    assert done.stderr.splitlines()[-1].split()[1] == "succeeded"
