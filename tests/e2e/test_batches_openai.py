"""The Files and Batches APIs end to end with the official ``openai`` SDK, unmodified, against the local stack (deployed
from the template: its authorizer, its routes, its controller on the control queue), over HTTP against moto server.

No worker runs here unless a test starts one: a batch that validates stays ``in_progress`` with its chunks queued.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
import requests

from async_inference.batches.store import BatchStore
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import SERVED_MODELS, TENANT_KEYS, Subscriber

pytestmark = pytest.mark.e2e
KEY_A, KEY_B = list(TENANT_KEYS)


@pytest.fixture(scope="module")
def sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def other_sdk(stack: LocalDeployment) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.api_url + "/v1", api_key=KEY_B, max_retries=0)


def line(custom_id: str, *, model: str = "echo-model", **changes: Any) -> dict[str, Any]:
    request = {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": f"say {custom_id}"}], "max_tokens": 8},
    }
    request.update(changes)
    return request


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((row if isinstance(row, bytes) else json.dumps(row).encode()) + b"\n" for row in lines)


def upload(sdk: openai.OpenAI, data: bytes, name: str = "input.jsonl") -> Any:
    return sdk.files.create(file=(name, data, "application/jsonl"), purpose="batch")


def until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def settled(sdk: openai.OpenAI, batch_id: str, *statuses: str, timeout_s: float = 30.0) -> Any:
    """The batch once the controller has moved it into one of ``statuses``."""
    batch = until(lambda: (b := sdk.batches.retrieve(batch_id)).status in statuses and b, timeout_s)
    assert batch, f"batch {batch_id} is {sdk.batches.retrieve(batch_id).status}, not one of {statuses}"
    return batch


# --- Models and auth ------------------------------------------------------------------------------------------------


def test_models_lists_the_served_names_in_openais_shape(sdk):
    # WHEN the SDK lists the models THEN it parses OpenAI's list shape and gets the names this deployment serves
    models = sdk.models.list()
    assert [m.id for m in models.data] == list(SERVED_MODELS)
    assert all(m.object == "model" and m.owned_by for m in models.data)


def test_bearer_and_x_api_key_are_both_accepted_through_the_templates_authorizer(stack):
    # GIVEN tenant A's key WHEN sent as a Bearer token and as x-api-key THEN both reach the API as tenant A
    for headers in ({"Authorization": f"Bearer {KEY_A}"}, {"x-api-key": KEY_A}):
        response = requests.get(f"{stack.api_url}/v1/models", headers=headers)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-key-of-ours-0000"},
        {"x-api-key": "not-a-key-of-ours-0000"},
        {"Authorization": "Basic abc"},
        {"Authorization": f"Bearer {KEY_A}", "x-api-key": KEY_B},
    ],
)
def test_a_missing_unknown_or_ambiguous_key_is_401_invalid_api_key(stack, headers):
    # WHEN a request carries no key, an unknown one, or keys of two tenants THEN the authorizer refuses it: 401 in
    # the error envelope, whose message says how to send a key
    response = requests.get(f"{stack.api_url}/v1/models", headers=headers)
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_api_key" and "Bearer" in error["message"]


def test_the_sdk_raises_authentication_error_for_a_bad_key(stack):
    bad = openai.OpenAI(base_url=stack.api_url + "/v1", api_key="not-a-key-of-ours-0000", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_a_job_for_a_model_not_served_is_a_404_model_not_found(stack):
    # GIVEN the jobs API WHEN a job names a model this deployment does not serve THEN 404 model_not_found, as vLLM
    # and OpenAI answer, and no job is created
    body = {"request": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}}
    response = requests.post(f"{stack.api_url}/v1/jobs", json=body, headers={"x-api-key": KEY_A})
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "model_not_found"
    assert "gpt-4o" in response.json()["error"]["message"]


# --- Files ----------------------------------------------------------------------------------------------------------


def test_a_file_uploads_lists_retrieves_and_reads_back_byte_for_byte(sdk):
    data = jsonl([line("a"), line("b")])
    # WHEN the SDK uploads a file (multipart, purpose=batch)
    created = upload(sdk, data, "mine.jsonl")
    # THEN it is a FileObject with the size and name, retrievable, listed, and its content is the same bytes
    assert (created.object, created.purpose, created.bytes, created.filename) == (
        "file",
        "batch",
        len(data),
        "mine.jsonl",
    )
    assert sdk.files.retrieve(created.id).id == created.id
    assert created.id in [f.id for f in sdk.files.list(purpose="batch")]
    assert sdk.files.content(created.id).read() == data


def test_a_deleted_file_is_gone(sdk):
    created = upload(sdk, jsonl([line("gone")]))
    deleted = sdk.files.delete(created.id)
    assert deleted.deleted is True and deleted.id == created.id
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(created.id)


def test_another_tenants_file_is_a_404_and_not_listed(sdk, other_sdk):
    # GIVEN tenant A's file WHEN tenant B retrieves, reads, deletes or lists THEN it is not found, as an unknown id
    created = upload(sdk, jsonl([line("private")]))
    for call in (other_sdk.files.retrieve, other_sdk.files.content, other_sdk.files.delete):
        with pytest.raises(openai.NotFoundError):
            call(created.id)
    assert created.id not in [f.id for f in other_sdk.files.list()]
    assert sdk.files.retrieve(created.id).id == created.id  # still A's


def test_a_large_file_goes_through_the_presigned_upload(stack, sdk):
    # GIVEN a file's size WHEN POST /v1/files/uploads (the extension) THEN the file exists awaiting its bytes, and
    # once they are PUT to the presigned URL it is processed and its content reads back
    data = jsonl([line(f"big-{i}") for i in range(50)])
    response = requests.post(
        f"{stack.api_url}/v1/files/uploads",
        headers={"Authorization": f"Bearer {KEY_A}"},
        json={"filename": "big.jsonl", "purpose": "batch", "bytes": len(data)},
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["status"] == "uploaded" and "awaiting its upload" in created["status_details"]
    put = requests.put(created["upload"]["url"], data=data, headers=created["upload"]["headers"])
    assert put.status_code == 200, put.text
    assert sdk.files.retrieve(created["id"]).status == "processed"
    assert sdk.files.content(created["id"]).read() == data


def test_a_file_over_the_inline_limit_is_a_413_naming_the_upload_path(stack):
    from async_inference import settings

    big = b"x" * (settings.MAX_FILE_INLINE_BYTES + 1)
    response = requests.post(
        f"{stack.api_url}/v1/files",
        headers={"x-api-key": KEY_A},
        data={"purpose": "batch"},
        files={"file": ("big.jsonl", big)},
    )
    assert response.status_code == 413, response.text
    assert "/v1/files/uploads" in response.json()["error"]["message"]


# --- Batches --------------------------------------------------------------------------------------------------------


def test_a_batch_is_created_validated_planned_listed_and_retrieved(stack, sdk):
    lines = [line(f"req-{i}") for i in range(250)]
    source = upload(sdk, jsonl(lines))
    # WHEN the SDK creates a batch
    batch = sdk.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"run": "e2e"}
    )
    # THEN it starts validating, the controller plans it into chunks of 100 lines, and it is in_progress
    assert (batch.object, batch.status, batch.input_file_id, batch.metadata) == (
        "batch",
        "validating",
        source.id,
        {"run": "e2e"},
    )
    planned = settled(sdk, batch.id, "in_progress")
    assert planned.request_counts.total == 250 and planned.model == "echo-model"
    assert planned.in_progress_at and planned.expires_at == batch.created_at + 24 * 3600
    assert batch.id in [b.id for b in sdk.batches.list(limit=100)]
    record = BatchStore(stack.resources.batch_table_name).get_batch(batch.id)
    assert [(c.first_line, c.line_count) for c in record.chunks] == [(1, 100), (101, 100), (201, 50)]


def test_batches_list_pages_with_after_and_limit(sdk):
    source = upload(sdk, jsonl([line("p")]))
    made = [
        sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id
        for _ in range(3)
    ]
    first = sdk.batches.list(limit=2)
    second = sdk.batches.list(limit=2, after=first.data[-1].id)
    assert first.has_more and len(first.data) == 2
    seen = [b.id for b in first.data + second.data]
    assert seen[:3] == made[::-1]  # newest first, no gap or repeat across the pages


@pytest.mark.parametrize(
    ("lines", "code", "failing_line"),
    [
        ([line("ok"), b"{not json"], "invalid_json_line", 2),
        (
            [line("ok"), {"method": "POST", "url": "/v1/chat/completions", "body": {"model": "echo-model"}}],
            "missing_required_parameter",
            2,
        ),
        ([line("same"), line("other"), line("same")], "duplicate_custom_id", 3),
        ([line("ok"), line("bad-url", url="/v1/embeddings")], "invalid_url", 2),
        ([line("bad-method", method="GET")], "invalid_method", 1),
        ([line("ok"), line("ok2"), line("unknown", model="gpt-4o")], "model_not_found", 3),
    ],
)
def test_a_structural_error_fails_the_batch_naming_the_line_and_nothing_runs(stack, sdk, lines, code, failing_line):
    source = upload(sdk, jsonl(lines))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    # THEN the controller fails it with an error naming the line, and queues no chunk
    failed = settled(sdk, batch.id, "failed")
    assert [(e.code, e.line) for e in failed.errors.data] == [(code, failing_line)]
    assert failed.failed_at and failed.output_file_id is None
    record = BatchStore(stack.resources.batch_table_name).get_batch(batch.id)
    assert record.chunks == [] and record.chunk_count is None


def test_more_lines_than_a_batch_holds_fail_it(stack, sdk):
    from async_inference import settings

    # 50,001 short lines (about 5 MB): through the presigned upload, as a file over the inline limit goes
    too_many = settings.BATCH_MAX_LINES + 1
    data = b"".join(
        b'{"custom_id":"%d","method":"POST","url":"/v1/chat/completions","body":{"model":"echo-model"}}\n' % i
        for i in range(too_many)
    )
    response = requests.post(
        f"{stack.api_url}/v1/files/uploads",
        headers={"x-api-key": KEY_A},
        json={"filename": "huge.jsonl", "purpose": "batch", "bytes": len(data)},
    )
    created = response.json()
    assert requests.put(created["upload"]["url"], data=data, headers=created["upload"]["headers"]).ok
    batch = sdk.batches.create(input_file_id=created["id"], endpoint="/v1/chat/completions", completion_window="24h")
    failed = settled(sdk, batch.id, "failed", timeout_s=60)
    assert [(e.code, e.line) for e in failed.errors.data] == [("too_many_requests", too_many)]


def test_a_body_the_schema_refuses_is_not_a_structural_error(sdk):
    # GIVEN a line whose body the request schema refuses (max_tokens 0) WHEN the batch is planned THEN it is not failed:
    # that line becomes a 400 line of the error file, written by the worker
    source = upload(
        sdk, jsonl([line("fine"), line("bad-body", body={"model": "echo-model", "messages": [], "max_tokens": 0})])
    )
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert settled(sdk, batch.id, "in_progress").request_counts.total == 2


def test_another_tenants_batch_is_a_404_and_not_listed(sdk, other_sdk):
    source = upload(sdk, jsonl([line("mine")]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (other_sdk.batches.retrieve, other_sdk.batches.cancel):
        with pytest.raises(openai.NotFoundError):
            call(batch.id)
    assert batch.id not in [b.id for b in other_sdk.batches.list(limit=100)]
    # and B cannot start a batch on A's file
    with pytest.raises(openai.NotFoundError):
        other_sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_cancel_before_any_chunk_ran_moves_the_batch_to_cancelling(sdk):
    # GIVEN a planned batch whose chunks no worker has taken yet
    source = upload(sdk, jsonl([line(f"c-{i}") for i in range(5)]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    settled(sdk, batch.id, "in_progress")
    # WHEN the SDK cancels it THEN it is cancelling, with its timestamp, and nothing counted
    cancelled = sdk.batches.cancel(batch.id)
    assert cancelled.status == "cancelling" and cancelled.cancelling_at
    assert cancelled.request_counts.completed == cancelled.request_counts.failed == 0
    assert sdk.batches.cancel(batch.id).status == "cancelling"  # a second cancel is harmless


def test_cancel_while_validating_ends_it_cancelled_with_nothing_run(stack, sdk):
    # GIVEN a batch cancelled before the controller planned it (stored here without its plan step, so the order is
    # certain) WHEN the plan step runs THEN it finds the batch cancelling, plans nothing and finalizes it cancelled
    # with no output file, and publishes batch.cancelled
    import datetime as dt

    from async_inference.batches.controller import BatchController
    from async_inference.batches.models import BatchRecord, BatchStatus, new_batch_id
    from async_inference.config import ServiceSettings
    from async_inference.schemas import utcnow

    source = upload(sdk, jsonl([line("never")]))
    store = BatchStore(stack.resources.batch_table_name)
    now = utcnow()
    record = BatchRecord(
        id=new_batch_id(),
        tenant="tenant-a",
        created_at=now,
        status=BatchStatus.VALIDATING,
        endpoint="/v1/chat/completions",
        input_file_id=source.id,
        input_key=f"files/tenant-a/{source.id}/content",
        completion_window="24h",
        deadline=now + dt.timedelta(hours=24),
    )
    store.create(record)
    subscriber = Subscriber(stack)
    assert sdk.batches.cancel(record.id).status == "cancelling"
    lane = stack.resources.batch_queue_url
    config = ServiceSettings.load(
        batch_table_name=stack.resources.batch_table_name,
        model_fleets=json.dumps({"*": {"queue_url": lane, "batch_queue_url": lane}}),
    )
    BatchController.from_settings(config).plan(record.id)
    final = sdk.batches.retrieve(record.id)
    assert (final.status, final.output_file_id, final.request_counts.total) == ("cancelled", None, 0)
    assert final.cancelled_at and final.cancelling_at
    assert [e["type"] for e in subscriber.for_job(record.id, wait_s=3)] == ["batch.cancelled"]


def test_an_input_file_of_another_purpose_or_not_uploaded_is_a_400(stack, sdk):
    response = requests.post(
        f"{stack.api_url}/v1/files/uploads",
        headers={"x-api-key": KEY_A},
        json={"filename": "later.jsonl", "purpose": "batch", "bytes": 10},
    )
    pending = response.json()["id"]
    with pytest.raises(openai.BadRequestError, match="not been uploaded"):
        sdk.batches.create(input_file_id=pending, endpoint="/v1/chat/completions", completion_window="24h")


# --- The worker's side: record_chunk, and the output file (the worker writes the parts) ----------------------------


def test_record_chunk_counts_a_chunk_once_and_says_when_all_are_counted(stack, sdk):
    source = upload(sdk, jsonl([line(f"r-{i}") for i in range(150)]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    settled(sdk, batch.id, "in_progress")
    store = BatchStore(stack.resources.batch_table_name)
    first = store.record_chunk(batch.id, 0, completed=99, failed=1)
    again = store.record_chunk(batch.id, 0, completed=99, failed=1)  # a redelivered chunk
    last = store.record_chunk(batch.id, 1, completed=50, failed=0)
    assert (first.counted, first.all_counted) == (True, False)
    assert (again.counted, again.all_counted) == (False, False)
    assert (last.counted, last.all_counted) == (True, True)
    counts = sdk.batches.retrieve(batch.id).request_counts
    assert (counts.total, counts.completed, counts.failed) == (150, 149, 1)
    assert store.statuses([batch.id, "batch_" + "0" * 32]) == {batch.id: store.get_batch(batch.id).status}


def test_a_batch_runs_to_completed_with_one_output_line_per_custom_id(stack, sdk, worker):
    subscriber = Subscriber(stack)
    ids = [f"out-{i}" for i in range(120)]
    source = upload(sdk, jsonl([line(i) for i in ids]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = settled(sdk, batch.id, "completed", timeout_s=120)
    assert (done.request_counts.completed, done.request_counts.failed) == (120, 0)
    assert done.error_file_id is None  # no errors, no error file, as OpenAI
    rows = [json.loads(r) for r in sdk.files.content(done.output_file_id).read().splitlines()]
    assert sorted(r["custom_id"] for r in rows) == sorted(ids)
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in rows)
    events = subscriber.for_job(batch.id, wait_s=5)
    assert [e["type"] for e in events] == ["batch.completed"]


def _write_parts(
    stack: LocalDeployment, batch_id: str, outputs: dict[int, list[dict]], errors: dict[int, list[dict]]
) -> None:
    """Each chunk's parts, written as the worker writes them (docs/design/batches.md: JSONL in OpenAI's line format,
    once, an empty part still written)."""
    from async_inference import settings
    from async_inference.aws import client

    s3 = client("s3")
    for chunk in sorted(set(outputs) | set(errors)):
        for kind, rows in (("output", outputs.get(chunk, [])), ("error", errors.get(chunk, []))):
            s3.put_object(
                Bucket=stack.resources.config.bucket_name,
                Body=jsonl(rows) if rows else b"",
                Key=settings.batch_part_key("tenant-a", batch_id, chunk, kind),
                IfNoneMatch="*",
            )


def _answer(custom_id: str) -> dict:
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "error": None,
        "response": {"status_code": 200, "request_id": custom_id, "body": {"object": "chat.completion"}},
    }


def _refused(custom_id: str, code: str | None = None) -> dict:
    if code:
        return {
            "id": f"batch_req_{custom_id}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": "not finished within the completion window"},
        }
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "error": None,
        "response": {"status_code": 400, "request_id": custom_id, "body": {"error": {"message": "max_tokens"}}},
    }


@pytest.mark.parametrize(("last_error_code", "final"), [(None, "completed"), ("batch_expired", "expired")])
def test_finalize_concatenates_the_parts_into_the_output_and_error_files(stack, sdk, last_error_code, final):
    # GIVEN a planned batch of 150 lines whose two chunks' parts are written and counted, as the worker does
    from async_inference.batches.aws import ControlQueue
    from async_inference.schemas import BatchControl

    ids = [f"f-{i}" for i in range(150)]
    source = upload(sdk, jsonl([line(i) for i in ids]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    settled(sdk, batch.id, "in_progress")
    subscriber = Subscriber(stack)
    _write_parts(
        stack,
        batch.id,
        outputs={0: [_answer(i) for i in ids[:100]], 1: [_answer(i) for i in ids[100:149]]},
        errors={0: [], 1: [_refused(ids[149], last_error_code)]},
    )
    store = BatchStore(stack.resources.batch_table_name)
    store.record_chunk(batch.id, 0, completed=100, failed=0)
    assert store.record_chunk(batch.id, 1, completed=49, failed=1).all_counted
    # WHEN the worker that counted the last chunk sends the finalize step (to the template's control queue)
    ControlQueue(stack.resources.batch_control_queue_url).send(
        BatchControl(kind="finalize", batch_id=batch.id, tenant="tenant-a")
    )
    # THEN the controller writes one output and one error file, every custom_id in exactly one, and ends the batch
    done = settled(sdk, batch.id, final)
    output = [json.loads(r)["custom_id"] for r in sdk.files.content(done.output_file_id).read().splitlines()]
    errors = [json.loads(r)["custom_id"] for r in sdk.files.content(done.error_file_id).read().splitlines()]
    assert output == ids[:149] and errors == ids[149:]
    assert sdk.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert done.finalizing_at and (done.completed_at if final == "completed" else done.expired_at)
    assert [e["type"] for e in subscriber.for_job(batch.id, wait_s=3)] == [f"batch.{final}"]
    # and a second finalize (a redelivery) changes nothing and notifies nothing more
    ControlQueue(stack.resources.batch_control_queue_url).send(
        BatchControl(kind="finalize", batch_id=batch.id, tenant="tenant-a")
    )
    time.sleep(3)
    again = sdk.batches.retrieve(batch.id)
    assert (again.status, again.output_file_id, again.error_file_id) == (final, done.output_file_id, done.error_file_id)
    assert (
        subscriber.for_job(batch.id, wait_s=1) == subscriber.by_job[batch.id] and len(subscriber.by_job[batch.id]) == 1
    )


def test_a_batch_with_no_errors_has_no_error_file(stack, sdk):
    from async_inference.batches.aws import ControlQueue
    from async_inference.schemas import BatchControl

    source = upload(sdk, jsonl([line("only")]))
    batch = sdk.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    settled(sdk, batch.id, "in_progress")
    _write_parts(stack, batch.id, outputs={0: [_answer("only")]}, errors={0: []})
    assert BatchStore(stack.resources.batch_table_name).record_chunk(batch.id, 0, completed=1, failed=0).all_counted
    ControlQueue(stack.resources.batch_control_queue_url).send(
        BatchControl(kind="finalize", batch_id=batch.id, tenant="tenant-a")
    )
    done = settled(sdk, batch.id, "completed")
    assert done.error_file_id is None and done.output_file_id
