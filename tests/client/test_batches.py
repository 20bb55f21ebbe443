"""The SDK's batch methods, Client and AsyncClient alike, against a real local HTTP server: what each sends and what it
parses, wait_batch on a fake clock, and the CLI's progress over request_counts."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from async_inference_client import AsyncClient, BatchWaitTimeout, Client
from async_inference_client.cli import BatchProgress
from async_inference_client.models.batches import Batch
from tests.client.fake_api import FakeApi, FakeTime, Reply, Seen

KEY = "test-key-0123456789abcdef"
BATCH_ID = "batch_" + "0" * 32
FILE_ID = "file-" + "a" * 24


def batch_view(status: str = "in_progress", completed: int = 0, failed: int = 0, total: int = 4) -> dict[str, Any]:
    return {
        "id": BATCH_ID,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "input_file_id": FILE_ID,
        "completion_window": "24h",
        "status": status,
        "created_at": 1,
        "request_counts": {"completed": completed, "failed": failed, "total": total},
    }


def file_view() -> dict[str, Any]:
    return {
        "id": FILE_ID,
        "object": "file",
        "bytes": 3,
        "created_at": 1,
        "filename": "in.jsonl",
        "purpose": "batch",
        "status": "processed",
    }


class BatchApi:
    """A batch that finishes after ``polls`` GETs; files are stored; every route the SDK's batch methods call."""

    def __init__(self, polls: int = 3) -> None:
        self.polls = polls
        self.gets = 0

    def __call__(self, seen: Seen) -> Reply:
        path = seen.path.split("?")[0]
        if (seen.method, path) == ("POST", "/v1/files"):
            return Reply(200, file_view())
        if (seen.method, path) == ("GET", f"/v1/files/{FILE_ID}/content"):
            return Reply(200, b'{"custom_id": "a"}\n')
        if (seen.method, path) == ("POST", "/v1/batches"):
            return Reply(200, batch_view("validating"))
        if (seen.method, path) == ("GET", f"/v1/batches/{BATCH_ID}"):
            self.gets += 1
            done = self.gets >= self.polls
            return Reply(200, batch_view("completed" if done else "in_progress", completed=min(self.gets, 4), total=4))
        if (seen.method, path) == ("GET", "/v1/batches"):
            return Reply(
                200,
                {
                    "object": "list",
                    "data": [batch_view()],
                    "first_id": BATCH_ID,
                    "last_id": BATCH_ID,
                    "has_more": False,
                },
            )
        if (seen.method, path) == ("POST", f"/v1/batches/{BATCH_ID}/cancel"):
            return Reply(200, batch_view("cancelling"))
        return Reply(404, {"error": {"code": "not_found", "message": path, "details": []}})


def _sync_calls(client: Client) -> list[Any]:
    uploaded = client.upload_file(b"{}\n", filename="in.jsonl")
    created = client.create_batch(uploaded.id, metadata={"k": "v"}, webhook="https://example.com/hook")
    return [
        uploaded,
        created,
        client.get_batch(BATCH_ID),
        client.list_batches(limit=5),
        client.cancel_batch(BATCH_ID),
        client.file_content(FILE_ID),
    ]


async def _async_calls(client: AsyncClient) -> list[Any]:
    uploaded = await client.upload_file(b"{}\n", filename="in.jsonl")
    created = await client.create_batch(uploaded.id, metadata={"k": "v"}, webhook="https://example.com/hook")
    return [
        uploaded,
        created,
        await client.get_batch(BATCH_ID),
        await client.list_batches(limit=5),
        await client.cancel_batch(BATCH_ID),
        await client.file_content(FILE_ID),
    ]


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_both_clients_send_the_same_batch_requests_and_parse_the_same_objects(flavour: str):
    # GIVEN the batch API WHEN each client uploads, creates (with a webhook), reads, lists, cancels and downloads
    with FakeApi(BatchApi()) as api:
        if flavour == "sync":
            with Client(api.url, KEY) as client:
                results = _sync_calls(client)
        else:

            async def run() -> list[Any]:
                async with AsyncClient(api.url, KEY) as client:
                    return await _async_calls(client)

            results = asyncio.run(run())
        sent = [(s.method, s.path) for s in api.seen]
        create = next(s for s in api.seen if (s.method, s.path) == ("POST", "/v1/batches")).json()
    # THEN the requests are the documented routes, the batch body carries the webhook, and the answers are models
    assert sent == [
        ("POST", "/v1/files"),
        ("POST", "/v1/batches"),
        ("GET", f"/v1/batches/{BATCH_ID}"),
        ("GET", "/v1/batches?limit=5"),
        ("POST", f"/v1/batches/{BATCH_ID}/cancel"),
        ("GET", f"/v1/files/{FILE_ID}/content"),
    ]
    assert create == {
        "input_file_id": FILE_ID,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"k": "v"},
        "webhook": {"url": "https://example.com/hook"},
    }
    uploaded, created, got, page, cancelled, content = results
    assert uploaded.id == FILE_ID and created.status.value == "validating" and isinstance(got, Batch)
    assert [b.id for b in page.data] == [BATCH_ID] and cancelled.status.value == "cancelling"
    assert content == b'{"custom_id": "a"}\n'


def test_async_wait_batch_polls_until_final_and_reports_each_view():
    # GIVEN a batch that is final on its third GET WHEN the async client waits on a fake clock
    time = FakeTime()
    seen: list[int] = []
    with FakeApi(BatchApi(polls=3)) as api:

        async def run() -> Batch:
            async with AsyncClient(api.url, KEY, sleep=time.async_sleep, clock=time.clock) as client:
                return await client.wait_batch(BATCH_ID, on_update=lambda b: seen.append(b.request_counts.completed))

        final = asyncio.run(run())
    # THEN it returns the final view after three polls, two sleeps between them, each view reported
    assert final.status.value == "completed"
    assert seen == [1, 2, 3] and len(time.sleeps) == 2


def test_async_wait_batch_gives_up_at_its_timeout_with_the_last_view():
    time = FakeTime()
    with FakeApi(BatchApi(polls=10**6)) as api:

        async def run() -> Batch:
            async with AsyncClient(api.url, KEY, sleep=time.async_sleep, clock=time.clock) as client:
                return await client.wait_batch(BATCH_ID, timeout_s=5)

        with pytest.raises(BatchWaitTimeout) as gave_up:
            asyncio.run(run())
    assert gave_up.value.batch.status.value == "in_progress" and time.now == pytest.approx(5)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_batch_progress_bar_follows_request_counts_on_a_terminal():
    # GIVEN a terminal WHEN the batch's views come in THEN the bar's total and position are its request counts
    stream = Terminal()
    progress = BatchProgress(stream)
    for done in (0, 2, 4):
        progress(Batch.model_validate(batch_view(completed=done - min(done, 1), failed=min(done, 1), total=4)))
    progress.done()
    assert "4/4" in stream.getvalue() and "2/4" in stream.getvalue()
    assert BATCH_ID in stream.getvalue()


def test_the_batch_progress_writes_a_line_per_change_elsewhere():
    stream = io.StringIO()
    progress = BatchProgress(stream)
    for completed in (0, 0, 3):
        progress(Batch.model_validate(batch_view(completed=completed, failed=1 if completed else 0)))
    assert stream.getvalue().splitlines() == [
        f"{BATCH_ID}  in_progress 0/4 done, 0 failed",
        f"{BATCH_ID}  in_progress 4/4 done, 1 failed",
    ]
