"""Conformance over a corpus of real OpenAI request bodies (tests/conformance/corpus: 253 chat.completions bodies that
real clients sent, from 38 public repositories), the acceptance half: what the API answers each body, against what
OpenAI itself would do with it (tests/conformance/openai_reference.py decides that from the body's fields).

- every body OpenAI would take and a text model can answer is accepted: at least 95% of them, and each one refused
  is a 400 naming a field, listed with its reason in the test's output;
- every body OpenAI would take that asks for what a text-only job cannot do (non-text inputs, audio output, hosted
  services) is a 400 naming that field; a streamed body is a job like any other (its tokens go to the job's event
  log), and as a batch line a 400 naming ``stream``, as a batch line cannot stream;
- every body OpenAI would refuse is a 4xx; no body is a 5xx.

Through the jobs API (``POST /v1/jobs``, over HTTP, the template's functions) and, for the bodies that came from
batch files, as the lines of one batch run by a worker with the echo engine (the line's result is its 200 or
its 400). Run with ``-s`` to see the per-parameter counts and the refused bodies.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import requests

from async_inference.aws import client
from async_inference.schemas import ChatCompletionRequest
from gpu_worker.engines.asks import asks_of, refuse_beyond_text
from gpu_worker.engines.base import PermanentEngineError
from local_runtime.stack import LocalDeployment
from tests.conformance.openai_reference import CHAT, FEATURES, Sample, Verdict, chat_samples, classify
from tests.e2e.conftest import TENANT_KEYS
from tests.e2e.test_batches_openai import settled

pytestmark = pytest.mark.e2e
KEY = list(TENANT_KEYS)[0]
MODEL = "echo-model"
ACCEPTED_AT_LEAST = 0.95


@dataclass
class Answer:
    sample: Sample
    verdict: Verdict
    status: int
    fields: list[str]  # the fields a refusal names (its details), in order
    message: str


def _jobs_answer(stack: LocalDeployment, sample: Sample) -> Answer:
    response = requests.post(
        f"{stack.api_url}/v1/jobs", json={"request": sample.body}, headers={"x-api-key": KEY}, timeout=30
    )
    error = response.json().get("error") if response.status_code >= 400 else None
    fields = [d["field"].removeprefix("request.") for d in error["details"]] if error else []
    return Answer(sample, classify(sample.body), response.status_code, fields, error["message"] if error else "")


@pytest.fixture(scope="module")
def answers(stack: LocalDeployment) -> list[Answer]:
    found = [_jobs_answer(stack, sample) for sample in chat_samples(MODEL)]
    # The accepted bodies are queued jobs: take their claim checks off the shared queue, so that later workers do not
    # spend time on them. Received and deleted, not purged: SQS allows one PurgeQueue a minute, and the fuzz module
    # purges this queue too.
    assert stack.resources is not None
    sqs, url = client("sqs"), stack.resources.config.queue_url
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages"):
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        )
    return found


def _table(answers: list[Answer]) -> str:
    """Per parameter: the valid, in-scope bodies that use it and how many of them are accepted (markdown)."""
    rows = ["| parameter or shape | valid, in-scope bodies | accepted |", "| --- | ---: | ---: |"]
    valid = [a for a in answers if a.verdict.kind == "valid"]
    for name, uses in FEATURES.items():
        using = [a for a in valid if uses(a.sample.body)]
        rows.append(f"| {name} | {len(using)} | {sum(a.status == 202 for a in using)} |")
    return "\n".join(rows)


def test_no_body_is_a_5xx(answers: list[Answer]) -> None:
    assert [(a.sample.line, a.status) for a in answers if a.status >= 500] == []
    assert len(answers) == 253


def test_every_body_openai_refuses_is_a_4xx_naming_a_field(answers: list[Answer]) -> None:
    invalid = [a for a in answers if a.verdict.kind == "invalid"]
    assert invalid, "the corpus has bodies OpenAI refuses"
    assert [(a.sample.line, a.verdict.reason, a.status) for a in invalid if not 400 <= a.status < 500] == []
    assert [a.sample.line for a in invalid if a.status == 400 and not a.fields] == []


def test_what_a_text_only_job_cannot_do_is_a_400_naming_the_field(answers: list[Answer]) -> None:
    out = [a for a in answers if a.verdict.kind == "out_of_scope"]
    assert out, "the corpus has image and audio bodies"
    wrong = [
        (a.sample.line, a.verdict.reason, a.status, a.fields)
        for a in out
        if a.status != 400 or not set(a.fields) & a.verdict.fields
    ]
    assert wrong == []
    assert Counter(a.verdict.reason.split(",")[0] for a in out)["image_url input"] > 0


def test_at_least_95_percent_of_the_valid_in_scope_bodies_are_accepted(answers: list[Answer]) -> None:
    valid = [a for a in answers if a.verdict.kind == "valid"]
    accepted = [a for a in valid if a.status == 202]
    refused = [a for a in valid if a.status != 202]
    print(
        f"\nchat.completions bodies: {len(answers)}; valid and in scope: {len(valid)}, accepted {len(accepted)} "
        f"({len(accepted) / len(valid):.1%}); out of scope: "
        f"{sum(a.verdict.kind == 'out_of_scope' for a in answers)}; invalid: "
        f"{sum(a.verdict.kind == 'invalid' for a in answers)}"
    )
    print("refused valid, in-scope bodies:")
    for a in refused:
        print(f"- corpus line {a.sample.line} ({a.sample.source}): {a.status} {a.message}")
    print(_table(answers))
    # Each refusal says which field and why (a limit of this deployment, in its message).
    assert [a.sample.line for a in refused if a.status != 400 or not a.fields] == []
    assert len(accepted) >= ACCEPTED_AT_LEAST * len(valid), [(a.sample.line, a.message) for a in refused]


def _echo_refusal(body: dict[str, Any]) -> str | None:
    """What the echo engine answers an accepted body it cannot honour, or None when it answers it."""
    try:
        refuse_beyond_text(asks_of(ChatCompletionRequest.model_validate_json(json.dumps(body))), "echo")
    except PermanentEngineError as exc:
        return str(exc)
    return None


def test_the_batch_file_bodies_as_batch_lines_get_the_same_answers(
    stack: LocalDeployment, answers: list[Answer], worker: Any
) -> None:
    # GIVEN the bodies that came from batch files, as the lines of one batch input file
    by_id = {f"line-{a.sample.line}": a for a in answers if a.sample.from_batch_file}
    assert len(by_id) >= 80
    data = b"".join(
        json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": a.sample.body}).encode() + b"\n"
        for custom_id, a in by_id.items()
    )
    sdk = openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY, max_retries=0)
    source = sdk.files.create(file=("corpus.jsonl", data, "application/jsonl"), purpose="batch")
    # WHEN it runs as a batch (a worker with the echo engine)
    batch = sdk.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    done = settled(sdk, batch.id, "completed", "failed", timeout_s=180)
    assert done.status == "completed", done.errors
    lines = [
        json.loads(row)
        for file_id in (done.output_file_id, done.error_file_id)
        if file_id
        for row in sdk.files.content(file_id).read().splitlines()
    ]
    # THEN each line's answer is its body's answer on the jobs API: a 200 where the job was accepted, a 400 naming
    # the same field where it was refused; never a 5xx
    assert sorted(line["custom_id"] for line in lines) == sorted(by_id)
    for line in lines:
        job = by_id[line["custom_id"]]
        status = line["response"]["status_code"]
        assert status < 500, line
        if job.status == 202:
            # accepted by the API; the echo engine this test runs refuses what its echoed words cannot honour (a JSON
            # format, a forced tool call, logprobs: gpu_worker/engines/echo.py), naming the parameter, where the CPU
            # and vLLM engines answer it (tests/conformance/test_engine_execution.py)
            refusal = _echo_refusal(job.sample.body)
            if job.sample.body.get("stream") is True:
                # a batch line has no stream to send its tokens to (BatchInputLine.request refuses it by name)
                assert (status, line["response"]["body"]["error"]["param"]) == (400, "stream"), (job.sample.line, line)
            elif refusal is None:
                assert status == 200, (job.sample.line, line)
            else:
                assert (status, line["response"]["body"]["error"]["message"]) == (400, refusal), (job.sample.line, line)
        else:
            assert (status, line["response"]["body"]["error"]["param"]) == (400, job.fields[0]), (job.sample.line, line)
