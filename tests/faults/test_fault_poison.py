"""Jobs that can never succeed end `failed` with a reason on their first receive; the rest of their batch succeeds."""

from __future__ import annotations

import json

from async_inference import settings
from tests.faults.fault_stack import TENANT, FaultStack, Subscriber, chat, wait_until


def test_each_poison_payload_fails_its_job_at_once_and_the_batch_still_succeeds(
    workers: FaultStack, subscriber: Subscriber
):
    # GIVEN one batch of queued jobs: two good ones, and one of each kind that can never succeed. The API refuses
    # most of these at the door, so their stored payloads are spoiled after submission, as a bug or an operator might.
    api, s3 = workers.api(), workers.client("s3")
    good = [api.submit(chat(f"good job {i}", max_tokens=3)).job_id for i in range(2)]
    spoiled = {
        "missing": (None, "payload is missing"),
        "not_json": (b"{this is not json", "not valid JSON"),
        "schema": (json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        "max_tokens": (json.dumps(chat(max_tokens=settings.MAX_TOKENS_LIMIT + 1)).encode(), "max_tokens"),
    }
    poison: dict[str, tuple[str, str]] = {}
    for name, (body, reason) in spoiled.items():
        job_id = api.submit(chat(f"to be spoiled: {name}")).job_id
        key = settings.request_key(TENANT, job_id)
        if body is None:
            s3.delete_object(Bucket=workers.config.bucket_name, Key=key)
        else:
            s3.put_object(Bucket=workers.config.bucket_name, Key=key, Body=body)
        poison[job_id] = (name, reason)
    # a prompt longer than the model's context (the worker's echo engine is given a 50-token context below)
    too_long = api.submit(chat("word " * 60, max_tokens=1)).job_id
    poison[too_long] = ("too_long", "maximum context length is 50 tokens")

    # WHEN one worker receives them all
    worker = workers.start_worker("poison", ECHO_MAX_MODEL_LEN="50")
    jobs = workers.wait_final(good + list(poison), timeout_s=30)

    # THEN each poison job failed with a reason that says what is wrong, at its first receive. `attempts` counts
    # runs: a payload it cannot run with fails the job before it runs; the prompt too long for the context was tried
    # in the engine once
    for job_id, (name, reason) in poison.items():
        assert jobs[job_id].status.value == "failed", (name, jobs[job_id])
        assert reason in (jobs[job_id].error or ""), (name, jobs[job_id].error)
        assert jobs[job_id].attempts == (1 if name == "too_long" else 0), name
        assert workers.result_objects(job_id) == []
    # AND the good jobs in the same batch succeeded
    assert [jobs[j].status.value for j in good] == ["succeeded", "succeeded"]
    # AND every message was deleted (no retries burnt), and each job was notified once with its final state
    wait_until(lambda: workers.queue_depth() == 0, 10, "the batch's messages to be deleted")
    notes = subscriber.drain()
    assert {j: [n["status"] for n in notes[j]] for j in poison} == {j: ["failed"] for j in poison}
    assert {j: [n["status"] for n in notes[j]] for j in good} == {j: ["succeeded"] for j in good}
    assert not workers.client("sqs").receive_message(QueueUrl=workers.config.dlq_url).get("Messages")
    workers.stop_worker(worker)
