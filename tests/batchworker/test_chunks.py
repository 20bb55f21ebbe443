"""A worker runs a batch's chunks: per-chunk parts in OpenAI's line format, counted once, finalized by the last."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from async_inference import settings
from async_inference.served_models import ServedModels
from async_inference.service import parse_request_body
from gpu_worker.engines.echo import EchoEngine
from bench.batch_standin import input_line
from tests.batchworker.conftest import MODEL, AwsRequests, BatchStack, body, lines

pytestmark = pytest.mark.e2e


def test_a_batch_runs_to_one_part_pair_per_chunk_and_one_finalize(batches: BatchStack):
    # GIVEN a batch of 250 lines: three chunks of at most BATCH_CHUNK_LINES
    batch = batches.submit(lines(250))
    assert batch.chunks == 3
    # WHEN a worker with the batch lane runs it
    with batches.worker(EchoEngine(capacity=16)):
        item = batches.wait_counted(batch)
        finalizes = batches.finalizes()
    # THEN every line is in the output, once, in input order, as an OpenAI batch output line
    outputs, errors = batches.results(batch)
    assert [line["custom_id"] for line in outputs] == [f"req-{i}" for i in range(250)]
    assert errors == []
    first = outputs[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200 and first["response"]["request_id"].startswith("req_")
    completion = first["response"]["body"]
    assert completion["object"] == "chat.completion" and completion["model"] == MODEL
    assert completion["choices"][0]["message"]["content"] == "line 0 of req"
    # AND the batch counted every line once, and the control queue got one finalize for it
    assert (item["completed"], item["failed"]) == (250, 0)
    assert [(f.kind, f.batch_id, f.tenant) for f in finalizes] == [("finalize", batch.batch_id, batch.tenant)]
    # AND the input is gone from the batch lane
    assert batches.batch_queue_depth() == 0


def test_a_body_the_request_schema_refuses_is_a_400_error_line_with_the_jobs_message(batches: BatchStack):
    # GIVEN a batch whose second line's body has a role the schema does not know
    bad = body("x")
    bad["messages"][0]["role"] = "robot"
    batch = batches.submit([input_line("good", body("fine")), input_line("bad", bad), input_line("also-good", body())])
    # WHEN a worker runs it
    with batches.worker(EchoEngine()):
        item = batches.wait_counted(batch)
    # THEN the refused line is an error line: a 400 response carrying the message a job with that body fails with
    outputs, errors = batches.results(batch)
    assert [line["custom_id"] for line in outputs] == ["good", "also-good"]
    (error,) = errors
    _, expected = parse_request_body(json.dumps(bad).encode())
    assert error["custom_id"] == "bad" and error["error"] is None
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["message"] == expected
    assert error["response"]["body"]["error"]["param"] == "messages.0.role"
    assert (item["completed"], item["failed"]) == (2, 1)


def test_a_line_for_a_model_not_served_is_a_404_model_not_found_line(batches: BatchStack):
    # GIVEN a worker that serves one model, and a batch with a line for another
    batch = batches.submit([input_line("served", body()), input_line("other", {**body(), "model": "gpt-unknown"})])
    # WHEN it runs the batch
    with batches.worker(EchoEngine(), served_models=ServedModels.of([MODEL])):
        batches.wait_counted(batch)
    # THEN the other model's line is a 404 model_not_found error line
    outputs, errors = batches.results(batch)
    assert [line["custom_id"] for line in outputs] == ["served"]
    (error,) = errors
    assert error["custom_id"] == "other" and error["response"]["status_code"] == 404
    assert error["response"]["body"]["error"]["code"] == "model_not_found"
    assert error["response"]["body"]["error"]["message"] == ServedModels.of([MODEL]).not_found_message("gpt-unknown")


def test_each_part_is_written_once_even_when_its_chunk_is_delivered_again(batches: BatchStack):
    # GIVEN a batch run to the end by one worker
    batch = batches.submit(lines(120))
    with batches.worker(EchoEngine()):
        batches.wait_counted(batch)
    assert len(batches.finalizes()) == 1
    # WHEN its chunk claim checks are delivered again (SQS is at least once) and a worker runs them
    for claim in batch.claims:
        batches.sqs.send_message(QueueUrl=batches.resources.batch_queue_url, MessageBody=claim)
    with batches.worker(EchoEngine()) as worker:
        _wait(lambda: worker.chunks is not None and worker.chunks.chunks_done == batch.chunks, 30)
    # THEN every part and results object is still its first write (one S3 version each), and the batch counted once
    keys = batches.batch_keys(batch)
    assert len(keys) == 3 * batch.chunks
    assert {key: batches.versions(key) for key in keys} == {key: 1 for key in keys}
    item = batches.store.get(batch.batch_id)
    assert (item["completed"], item["failed"]) == (120, 0)
    # AND the redelivery still told the controller (finalize is idempotent; a crash may have eaten the first)
    assert len(batches.finalizes()) == batch.chunks


def _wait(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached after {timeout_s} s")
        time.sleep(0.05)


def test_a_chunk_costs_a_bounded_number_of_requests_whatever_its_lines(batches: BatchStack):
    # GIVEN a batch of five full chunks, and every AWS request the worker makes recorded
    batch = batches.submit(lines(5 * settings.BATCH_CHUNK_LINES))
    resources = batches.resources
    batch_urls = {resources.batch_queue_url, resources.control_queue_url}

    def for_the_batch(operation: str, params: dict[str, Any], result: Any) -> bool:
        if operation == "ReceiveMessage":  # an empty long poll is idle time, not the batch's work
            return params["QueueUrl"] == resources.batch_queue_url and bool(result.get("Messages"))
        return (params.get("QueueUrl") in batch_urls or params.get("TableName") == resources.table_name
                or resources.table_name in params.get("RequestItems", {})
                or str(params.get("Key", "")).startswith((settings.BATCH_PREFIX, batch.input_key)))

    # WHEN a worker runs it
    with AwsRequests().installed() as requests, batches.worker(EchoEngine(capacity=32)):
        batches.wait_counted(batch)
        time.sleep(1.0)  # the last batched delete
    used = Counter(op for op, params, result in requests.calls if for_the_batch(op, params, result))
    # THEN no request is made per line: each chunk costs one ranged read, three writes (results, output part,
    # error part), one status read, one count and its share of receives, deletes and heartbeat calls
    assert used["GetObject"] == batch.chunks
    assert used["PutObject"] == 3 * batch.chunks
    assert used["UpdateItem"] == batch.chunks
    assert used["SendMessage"] == 1  # the finalize
    assert used["ReceiveMessage"] <= batch.chunks and used["DeleteMessageBatch"] <= batch.chunks
    per_chunk = sum(used.values()) / batch.chunks
    assert per_chunk <= 12, used


def test_a_chunk_sent_before_its_batch_left_validating_runs(batches: BatchStack):
    # GIVEN a batch whose chunks were sent while it still reads validating (the controller sends them, then moves it
    # to in_progress; a worker can be faster than that second write, or a crash can come between the two)
    batch = batches.submit(lines(30), status="validating")
    # WHEN a worker receives its chunk
    with batches.worker(EchoEngine()):
        item = batches.wait_counted(batch, timeout_s=20)
    # THEN it ran the chunk, as it would for an in_progress batch
    outputs, errors = batches.results(batch)
    assert len(outputs) == 30 and errors == []
    assert (item["completed"], item["failed"]) == (30, 0)


def test_a_chunk_running_longer_than_the_visibility_timeout_is_kept_hidden_and_runs_once(batches: BatchStack):
    # GIVEN a worker whose messages come back 2 s after their last extension, and a chunk whose lines take 4 s
    from gpu_worker.engines.simulated import SimulatedEngine

    prompt = " ".join(f"w{i}" for i in range(200))  # 200 tokens at 20 ms a step
    batch = batches.submit([input_line(f"slow-{i}", body(prompt, max_tokens=200)) for i in range(10)])
    # WHEN it runs them
    with AwsRequests().installed() as requests, \
            batches.worker(SimulatedEngine(capacity=16, step_s=0.02), visibility_timeout_s=2) as worker:
        item = batches.wait_counted(batch, timeout_s=30)
        started = worker.chunks.chunks_started if worker.chunks else None
    # THEN the heartbeat kept the chunk hidden: it was received once and run once, its visibility extended meanwhile
    received = [len(result["Messages"]) for op, params, result in requests.calls if op == "ReceiveMessage"
                and params["QueueUrl"] == batches.resources.batch_queue_url and result.get("Messages")]
    extended = [params["Entries"] for op, params, _ in requests.calls if op == "ChangeMessageVisibilityBatch"
                and params["QueueUrl"] == batches.resources.batch_queue_url]
    assert received == [1] and started == 1
    assert len(extended) >= 4
    # AND every line is in the output once
    outputs, errors = batches.results(batch)
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"slow-{i}" for i in range(10)) and errors == []
    assert (item["completed"], item["failed"]) == (10, 0)
