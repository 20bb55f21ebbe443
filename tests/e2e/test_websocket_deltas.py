"""A streamed job's text over the WebSocket API, on the template-deployed stack: a standard client (``websockets``)
that follows a job submitted with ``stream: true`` gets its event log's segments as ``job.delta`` messages while the
worker decodes, in the log's order, carried from the log table's stream by the delta push function (the template's
event source mapping, run by the local runtime); another tenant's connection gets none of them.

The echo worker takes ``DELAY_S`` per answer, its words appearing at an even pace, and writes its log every 0.25 s."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import TENANT_KEYS, chat

pytestmark = pytest.mark.e2e

KEY_A, KEY_B = list(TENANT_KEYS)
DELAY_S = 4.0
WORDS = " ".join(f"word{i}" for i in range(24))
SEQ_PER_ATTEMPT = 1_000_000


@pytest.fixture(scope="module", autouse=True)
def slow_worker(stack: LocalDeployment) -> Iterator[subprocess.Popen[bytes]]:
    process = stack.start_worker(ECHO_DELAY_S=str(DELAY_S), STREAM_INTERVAL_S="0.25")
    yield process
    stack.stop_worker(process)


def socket(stack: LocalDeployment, key: str) -> ClientConnection:
    assert stack.ws_url is not None
    return connect(stack.ws_url, additional_headers={"x-api-key": key}, open_timeout=20)


def subscribe(connection: ClientConnection, **scope: Any) -> dict[str, Any]:
    connection.send(json.dumps({"action": "subscribe", **scope}))
    return json.loads(connection.recv(timeout=20))


def resume(connection: ClientConnection, **scope: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The reply to a subscribe that resumes a job, and what was pushed before it: once the subscription is stored, the
    push function sends what is written since, which may come before the reply (on a loaded host a delta and a job's
    last event did)."""
    connection.send(json.dumps({"action": "subscribe", **scope}))
    early: list[dict[str, Any]] = []
    while (message := json.loads(connection.recv(timeout=20)))["type"] not in ("subscribed", "error"):
        early.append(message)
    return message, early


def until_ended(connection: ClientConnection, api: Client, job_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    """The job's messages as they arrive, until both its last delta (the one with ``end``) and its final event came;
    each delta is stamped with the job's status read when it arrived."""
    told: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = json.loads(connection.recv(timeout=deadline - time.monotonic()))
        if message.get("job_id") != job_id:
            continue
        if message["type"] == "job.delta" and not any(m["type"] == "job.delta" for m in told):
            message["_status_when_first"] = api.get(job_id).status.value
        told.append(message)
        ended = any(m["type"] == "job.delta" and "end" in m for m in told)
        if ended and any(m["type"] == "job.completed" for m in told):
            return told
    raise AssertionError(f"{job_id} did not end within {timeout_s} s: {told}")


def test_a_streamed_jobs_text_reaches_its_subscriber_as_it_decodes(stack: LocalDeployment, api: Client):
    # GIVEN tenant-a following all of its jobs over the WebSocket API
    with socket(stack, KEY_A) as connection:
        assert subscribe(connection, all=True)["type"] == "subscribed"
        # WHEN tenant-a submits a job with stream: true, which takes DELAY_S to decode
        job = api.submit(chat(WORDS, stream=True))
        told = until_ended(connection, api, job.job_id)
    deltas = [m for m in told if m["type"] == "job.delta"]
    # THEN the first delta arrived while the job still ran, and several came before its end
    assert deltas[0]["_status_when_first"] == "running", deltas[0]
    assert len([d for d in deltas if d.get("deltas")]) >= 3, deltas
    # AND they are the log's segments in its order: one run's consecutive sequence numbers, the end last
    seqs = [d["seq"] for d in deltas]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[0] % SEQ_PER_ATTEMPT == 1, seqs
    assert "end" in deltas[-1] and all("end" not in d for d in deltas[:-1])
    assert deltas[-1]["end"]["status"] == "succeeded"
    # AND their text, the end's included, joins into the job's answer
    text = "".join(p["text"] for d in deltas for p in d.get("deltas", []) if p.get("index", 0) == 0)
    text += "".join(c.get("text", "") for c in deltas[-1]["end"]["choices"] if c.get("index", 0) == 0)
    assert text == api.result(job.job_id).choices[0].message.content == WORDS


def test_another_tenant_gets_none_of_a_jobs_deltas(stack: LocalDeployment, api: Client):
    # GIVEN tenant-b following all of its jobs and, by id, a streamed job of tenant-a; tenant-a following it too
    with socket(stack, KEY_B) as other, socket(stack, KEY_A) as mine:
        assert subscribe(other, all=True)["type"] == "subscribed"
        assert subscribe(mine, all=True)["type"] == "subscribed"
        job = api.submit(chat(WORDS, stream=True))
        assert subscribe(other, job_ids=[job.job_id])["type"] == "subscribed"
        # WHEN the job decodes and ends (tenant-a is told it all)
        told = until_ended(mine, api, job.job_id)
        assert any(m["type"] == "job.delta" for m in told)
        time.sleep(1.0)  # what the push had queued has arrived by now
        # THEN tenant-b received nothing at all
        with pytest.raises(TimeoutError):
            other.recv(timeout=0.5)


def test_a_job_that_does_not_stream_sends_no_deltas(stack: LocalDeployment, api: Client):
    # GIVEN tenant-a following all of its jobs
    with socket(stack, KEY_A) as connection:
        assert subscribe(connection, all=True)["type"] == "subscribed"
        # WHEN it submits a job without stream and it ends
        job = api.submit(chat("three short words"))
        types, deadline = [], time.monotonic() + 60
        while "job.completed" not in types and time.monotonic() < deadline:
            message = json.loads(connection.recv(timeout=deadline - time.monotonic()))
            if message.get("job_id") == job.job_id:
                types.append(message["type"])
    # THEN it was told the job's steps and no text
    assert types[-1] == "job.completed" and "job.delta" not in types, types


def _text(deltas: list[dict[str, Any]]) -> str:
    text = "".join(p["text"] for d in deltas for p in d.get("deltas", []) if p.get("index", 0) == 0)
    return text + "".join(c.get("text", "") for d in deltas if "end" in d for c in d["end"]["choices"])


def test_a_dropped_connection_resumes_after_the_last_delta_it_had(stack: LocalDeployment, api: Client):
    # GIVEN a connection that read the first two deltas of a streamed job, then dropped
    with socket(stack, KEY_A) as first:
        assert subscribe(first, all=True)["type"] == "subscribed"
        job = api.submit(chat(WORDS, stream=True))
        had: list[dict[str, Any]] = []
        while len(had) < 2:
            message = json.loads(first.recv(timeout=60))
            if message.get("job_id") == job.job_id and message["type"] == "job.delta":
                had.append(message)
    # WHEN a new connection subscribes to the job with starting_after the last seq it had
    with socket(stack, KEY_A) as second:
        answer, early = resume(second, job_ids=[job.job_id], starting_after=had[-1]["seq"])
        # THEN the reply carries the deltas written since, from the next seq on
        assert answer["type"] == "subscribed" and answer["starting_after"] == had[-1]["seq"], answer
        missed = answer["missed"]
        assert answer["more"] is False and all(m["type"] == "job.delta" for m in missed)
        assert not missed or missed[0]["seq"] == had[-1]["seq"] + 1, missed
        # AND the rest come live (some before the reply); those the reply carried already are told apart by their seq
        got = had + missed
        pushed = iter(early)
        while "end" not in got[-1]:
            message = next(pushed, None) or json.loads(second.recv(timeout=60))
            if message.get("type") == "job.delta" and message["seq"] > got[-1]["seq"]:
                got.append(message)
    seqs = [d["seq"] for d in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    # the end delta is written as the engine ends, before the result and the final state: read them once written
    assert api.wait(job.job_id, timeout_s=60).status.value == "succeeded"
    assert _text(got) == api.result(job.job_id).choices[0].message.content == WORDS


def test_another_tenant_resuming_a_job_gets_no_deltas(stack: LocalDeployment, api: Client):
    # GIVEN a streamed job of tenant-a that has ended, its log written
    job = api.submit(chat("one two three four", stream=True))
    assert api.wait(job.job_id, timeout_s=60).status.value == "succeeded"
    # WHEN tenant-b subscribes to it from the start, and tenant-a does
    with socket(stack, KEY_B) as other, socket(stack, KEY_A) as mine:
        theirs, pushed_to_them = resume(other, job_ids=[job.job_id], starting_after=0)
        own, _ = resume(mine, job_ids=[job.job_id], starting_after=0)  # its last events may come first: not deltas
    # THEN tenant-b's reply carries nothing, as for a job that does not exist; tenant-a's the whole answer
    assert theirs["type"] == "subscribed" and theirs["missed"] == [] and theirs["more"] is False
    assert pushed_to_them == []  # and nothing of the job was pushed to it before the reply either
    assert _text(own["missed"]) == "one two three four" and "end" in own["missed"][-1]


def test_starting_after_without_exactly_one_job_is_refused_with_what_to_fix(stack: LocalDeployment):
    # GIVEN a connection WHEN it asks to resume deltas of all its jobs
    with socket(stack, KEY_A) as connection:
        answer = subscribe(connection, all=True, starting_after=3)
    # THEN the reply is an error that names starting_after and job_ids
    assert answer["type"] == "error" and answer["code"] == "invalid_subscription", answer
    assert "starting_after" in answer["message"] and "job_ids" in answer["message"]
