"""A worker runs a batch's chunks: per-chunk parts in OpenAI's line format, counted once, finalized by the last, into
the output and error files the template's controller writes."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from async_inference import settings
from async_inference.batches.controller import BatchController
from async_inference.batches.models import BatchStatus
from async_inference.batches.store import BatchStore
from async_inference.config import ServiceSettings
from async_inference.jobs_service import parse_request_body
from async_inference.schemas import BatchControl
from async_inference.served_models import ServedModels
from gpu_worker.engines.echo import EchoEngine
from tests.batchworker.conftest import MODEL, AwsRequests, BatchStack, body, input_line, lines

pytestmark = pytest.mark.e2e


def finalizes_sent(requests: AwsRequests, stack: BatchStack) -> list[BatchControl]:
    """The control messages the worker sent."""
    return [
        BatchControl.model_validate_json(params["MessageBody"])
        for op, params, _ in requests.calls
        if op == "SendMessage" and params["QueueUrl"] == stack.control_queue_url
    ]


def test_a_batch_runs_to_one_part_pair_per_chunk_and_one_finalize(batches: BatchStack):
    # GIVEN a batch of 250 lines: three chunks of at most BATCH_CHUNK_LINES
    batch = batches.submit(lines(250))
    assert batch.chunks == 3
    # WHEN a worker with the batch lane runs it
    with AwsRequests().installed() as requests, batches.worker(EchoEngine(capacity=16)):
        _wait(lambda: batches.record(batch).all_counted, 60)
        time.sleep(0.5)  # the finalize goes out after the last count
    record = batches.wait_final(batch)
    # THEN the worker told the controller once, and the controller completed the batch
    assert [(f.kind, f.batch_id, f.tenant) for f in finalizes_sent(requests, batches)] == [
        ("finalize", batch.batch_id, batch.tenant)
    ]
    assert record.status is BatchStatus.COMPLETED
    # AND every line is in the output file, once, in input order, as an OpenAI batch output line; no error file
    outputs, errors = batches.files(record)
    assert [line["custom_id"] for line in outputs] == [f"req-{i}" for i in range(250)]
    assert errors == [] and record.error_file_id is None
    first = outputs[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200 and first["response"]["request_id"].startswith("req_")
    completion = first["response"]["body"]
    assert completion["object"] == "chat.completion" and completion["model"] == MODEL
    assert completion["choices"][0]["message"]["content"] == "line 0 of req"
    # AND it came from one output part and one error part per chunk; the batch counted every line once
    assert [len(batches.part(batch, chunk, "output") or []) for chunk in range(3)] == [100, 100, 50]
    assert [batches.part(batch, chunk, "error") for chunk in range(3)] == [[], [], []]
    assert (record.completed, record.failed, record.total) == (250, 0, 250)
    # AND the input is gone from the batch lane
    assert batches.batch_queue_depth() == 0


def test_a_body_the_request_schema_refuses_is_a_400_error_line_with_the_jobs_message(batches: BatchStack):
    # GIVEN a batch whose second line's body has a role the schema does not know (not a structural error: the
    # controller plans it)
    bad = body("x")
    bad["messages"][0]["role"] = "robot"
    batch = batches.submit([input_line("good", body("fine")), input_line("bad", bad), input_line("also-good", body())])
    # WHEN a worker runs it
    with batches.worker(EchoEngine()):
        record = batches.wait_final(batch)
    # THEN the refused line is in the error file: a 400 response carrying the message a job with that body fails with
    outputs, errors = batches.files(record)
    assert [line["custom_id"] for line in outputs] == ["good", "also-good"], (record, errors)
    (error,) = errors
    _, expected = parse_request_body(json.dumps(bad).encode())
    assert error["custom_id"] == "bad" and error["error"] is None
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["message"] == expected
    assert error["response"]["body"]["error"]["param"] == "messages.0.role"
    assert (record.status, record.completed, record.failed) == (BatchStatus.COMPLETED, 2, 1)


def test_a_line_for_a_model_the_worker_does_not_serve_is_a_404_model_not_found_line(batches: BatchStack):
    # GIVEN a batch for a model the controller lets through (the stack's API serves any name) and a worker that
    # serves one other model (a worker deployed with another SERVED_MODELS than the API's)
    batch = batches.submit([input_line(f"other-{i}", {**body(), "model": "gpt-unknown"}) for i in range(2)])
    # WHEN it runs the batch
    with batches.worker(EchoEngine(), served_models=ServedModels.of([MODEL])):
        record = batches.wait_final(batch)
    # THEN each line is a 404 model_not_found error line, and the batch has no output file
    outputs, errors = batches.files(record)
    assert outputs == [] and record.output_file_id is None
    assert [line["custom_id"] for line in errors] == ["other-0", "other-1"]
    assert {line["response"]["status_code"] for line in errors} == {404}
    assert {line["response"]["body"]["error"]["code"] for line in errors} == {"model_not_found"}
    assert {line["response"]["body"]["error"]["message"] for line in errors} == {
        ServedModels.of([MODEL]).not_found_message("gpt-unknown")
    }


def test_each_part_is_written_once_even_when_its_chunk_is_delivered_again(batches: BatchStack):
    # GIVEN a batch run to its last count by one worker, the chunk claim checks the controller queued for it kept,
    # and its finalize held on the control queue (the template's controller paused), so that it is still in_progress
    batch = batches.submit(lines(120))
    claims = batches.queued_claims(batch)
    with batches.fstack.local.event_source_paused(batches.control_queue_url):
        with batches.worker(EchoEngine()):
            _wait(lambda: batches.record(batch).all_counted, 30)
        # WHEN its chunk claim checks are delivered again (SQS is at least once) and a worker runs them
        for claim in claims:
            batches.sqs.send_message(QueueUrl=batches.batch_queue_url, MessageBody=claim)
        with AwsRequests().installed() as requests, batches.worker(EchoEngine()) as worker:
            _wait(lambda: worker.chunks is not None and worker.chunks.chunks_done == batch.chunks, 30)
            time.sleep(0.5)
        # THEN every part and results object is still its first write (one S3 version each), the batch counted once
        keys = batches.batch_keys(batch)
        assert len(keys) == 3 * batch.chunks
        assert {key: batches.versions(key) for key in keys} == {key: 1 for key in keys}
        record = batches.record(batch)
        assert (record.status, record.completed, record.failed) == (BatchStatus.IN_PROGRESS, 120, 0)
        # AND the redelivery still told the controller (finalize is idempotent; a crash may have eaten the first)
        assert [f.batch_id for f in finalizes_sent(requests, batches)] == [batch.batch_id] * batch.chunks
    # AND the controller, running again, completed it once from those parts: each line once in the output file
    record = batches.wait_final(batch)
    outputs, errors = batches.files(record)
    assert record.status is BatchStatus.COMPLETED and errors == []
    assert [line["custom_id"] for line in outputs] == [f"req-{i}" for i in range(120)]


def _wait(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached after {timeout_s} s")
        time.sleep(0.05)


def test_a_chunk_costs_a_bounded_number_of_requests_whatever_its_lines(batches: BatchStack):
    # GIVEN a batch of five full chunks, and every AWS request the worker makes recorded
    batch = batches.submit(lines(5 * settings.BATCH_CHUNK_LINES))
    batch_urls = {batches.batch_queue_url, batches.control_queue_url}

    def for_the_batch(operation: str, params: dict[str, Any], result: Any) -> bool:
        if operation == "ReceiveMessage":  # an empty long poll is idle time, not the batch's work
            return params["QueueUrl"] == batches.batch_queue_url and bool(result.get("Messages"))
        return (
            params.get("QueueUrl") in batch_urls
            or params.get("TableName") == batches.table_name
            or batches.table_name in params.get("RequestItems", {})
            or str(params.get("Key", "")).startswith((settings.BATCH_PREFIX, batch.input_key))
        )

    # WHEN a worker runs it
    with AwsRequests().installed() as requests, batches.worker(EchoEngine(capacity=32)):
        _wait(lambda: batches.record(batch).all_counted, 60)
        time.sleep(1.0)  # the last batched delete
    used = Counter(op for op, params, result in requests.calls if for_the_batch(op, params, result))
    # THEN no request is made per line: each chunk costs one ranged read, three writes (results, output part,
    # error part), one status read, one count and its share of receives, deletes and heartbeat calls
    assert used["GetObject"] == batch.chunks
    assert used["PutObject"] == 3 * batch.chunks
    assert used["UpdateItem"] == batch.chunks
    assert used["SendMessage"] == 1  # the finalize
    # (the lane's scout looks past a tenant's chunks while its budget is full: a look that finds this batch's next
    # chunk hands it back at once, one receive and one requeue, more of them the slower the host: gpu_worker.fairness)
    looks = sum(
        1
        for op, params, _ in requests.calls
        if op == "ChangeMessageVisibilityBatch"
        and params["QueueUrl"] == batches.batch_queue_url
        and all(entry["VisibilityTimeout"] == 0 for entry in params["Entries"])
    )
    assert used["ReceiveMessage"] <= batch.chunks + looks and used["DeleteMessageBatch"] <= batch.chunks
    per_chunk = sum(used.values()) / batch.chunks
    assert per_chunk <= 12, used


class DiesBeforeInProgress(BatchStore):
    """The batch table's adapter of a controller whose process dies after it sent the chunks, before it moves the
    batch to in_progress."""

    def transition(self, batch_id: str, target: BatchStatus, **options: Any):  # noqa: ANN201
        if target is BatchStatus.IN_PROGRESS:
            raise ConnectionError("the controller died before moving the batch to in_progress")
        return super().transition(batch_id, target, **options)


def test_a_chunk_sent_before_its_batch_left_validating_runs(batches: BatchStack):
    # GIVEN a batch whose chunks were sent while it still reads validating: the controller sends them, then moves it
    # to in_progress, and its process died in between (a worker can also be faster than that second write). The
    # template's controller is paused meanwhile: this test delivers the plan message to the controller's code itself,
    # with the settings the controller function runs with.
    local = batches.fstack.local
    with local.event_source_paused(batches.control_queue_url) as function:
        created = batches.create(lines(30))
        (message,) = batches.sqs.receive_message(
            QueueUrl=batches.control_queue_url, WaitTimeSeconds=5, VisibilityTimeout=60
        ).get("Messages", [])
        control = BatchControl.model_validate_json(message["Body"])
        assert (control.kind, control.batch_id) == ("plan", created.id)
        config = ServiceSettings.load(**function.environment)
        controller = BatchController.from_settings(config)
        controller.store = DiesBeforeInProgress(config.batch_table_name)
        with pytest.raises(ConnectionError):
            controller.handle(control)
        # the failed delivery leaves the plan message on the queue, to come back
        batches.sqs.change_message_visibility(
            QueueUrl=batches.control_queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )
        record = batches.record(created.id)
        assert record.status is BatchStatus.VALIDATING and record.planned
        batch = batches.submitted(record)
        # WHEN a worker receives its chunk
        with batches.worker(EchoEngine()):
            _wait(lambda: batches.record(batch).all_counted, 20)
        # THEN it ran the chunk, as it would for an in_progress batch
        record = batches.record(batch)
        assert (record.status, record.completed, record.failed) == (BatchStatus.VALIDATING, 30, 0)
        assert len(batches.part(batch, 0, "output") or []) == 30
    # AND once the template's controller runs again (the plan delivered again, the worker's finalize) it completes
    record = batches.wait_final(batch, timeout_s=30)
    outputs, errors = batches.files(record)
    assert record.status is BatchStatus.COMPLETED
    assert len(outputs) == 30 and errors == []


def test_a_chunk_running_longer_than_the_visibility_timeout_is_kept_hidden_and_runs_once(batches: BatchStack):
    # GIVEN a worker whose messages come back 2 s after their last extension, and a chunk whose lines take 4 s
    from gpu_worker.engines.simulated import SimulatedEngine

    prompt = " ".join(f"w{i}" for i in range(200))  # 200 tokens at 20 ms a step
    batch = batches.submit([input_line(f"slow-{i}", body(prompt, max_tokens=200)) for i in range(10)])
    # WHEN it runs them
    with (
        AwsRequests().installed() as requests,
        batches.worker(SimulatedEngine(capacity=16, step_s=0.02), visibility_timeout_s=2) as worker,
    ):
        record = batches.wait_final(batch, timeout_s=30)
        started = worker.chunks.chunks_started if worker.chunks else None
    # THEN the heartbeat kept the chunk hidden: it was received once and run once, its visibility extended meanwhile
    received = [
        len(result["Messages"])
        for op, params, result in requests.calls
        if op == "ReceiveMessage" and params["QueueUrl"] == batches.batch_queue_url and result.get("Messages")
    ]
    extended = [
        params["Entries"]
        for op, params, _ in requests.calls
        if op == "ChangeMessageVisibilityBatch" and params["QueueUrl"] == batches.batch_queue_url
    ]
    assert received == [1] and started == 1
    assert len(extended) >= 4
    # AND every line is in the output file once
    outputs, errors = batches.files(record)
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"slow-{i}" for i in range(10)) and errors == []
    assert (record.completed, record.failed) == (10, 0)
