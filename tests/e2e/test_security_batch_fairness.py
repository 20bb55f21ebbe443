"""Fair scheduling between tenants' batches, measured on the local stack (issue #16, finding 3): tenant A's batch
fills the batch lane with chunks, tenant B's one-line batch created afterwards runs at the next free engine slot, not
after A's chunks (gpu_worker.fairness, the batch lane's scout; docs/security.md, "Fair scheduling")."""

from __future__ import annotations

import json
import time

import pytest

from async_inference_client import Client
from local_runtime.stack import LocalDeployment

pytestmark = pytest.mark.e2e

SLOTS = 2
LINE_S = 0.1  # each line's generation
A_LINES = 400  # 4 chunks: 20 s of A's lines on the 2 slots


def jsonl(prefix: str, count: int) -> bytes:
    body = {"model": "echo-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    row = {"method": "POST", "url": "/v1/chat/completions", "body": body}
    return b"".join(json.dumps({"custom_id": f"{prefix}-{i}", **row}).encode() + b"\n" for i in range(count))


def test_a_tenants_small_batch_runs_beside_another_tenants_large_one(
    stack: LocalDeployment, api: Client, other_api: Client
):
    # GIVEN one worker of 2 engine slots (none reserved for interactive jobs), each line taking 0.1 s, and tenant A's
    # batch of 400 lines (4 chunks, 20 s of work) in progress
    worker = stack.start_worker(MAX_NUM_SEQS=str(SLOTS), INTERACTIVE_RESERVE="0", ECHO_DELAY_S=str(LINE_S))
    try:
        a_file = api.upload_file(jsonl("a", A_LINES), filename="a.jsonl")
        a = api.create_batch(a_file.id, completion_window="24h")
        deadline = time.monotonic() + 30
        while api.get_batch(a.id).status != "in_progress" and time.monotonic() < deadline:
            time.sleep(0.2)
        # WHEN tenant B creates a one-line batch
        b_file = other_api.upload_file(jsonl("b", 1), filename="b.jsonl")
        b = other_api.create_batch(b_file.id, completion_window="24h")
        b_done = other_api.wait_batch(b.id, timeout_s=120)
        a_done = api.wait_batch(a.id, timeout_s=120)
    finally:
        stack.stop_worker(worker)
    # THEN B's batch completed within a few seconds of its creation, long before A's
    assert (b_done.status, a_done.status) == ("completed", "completed")
    assert b_done.completed_at is not None and a_done.completed_at is not None
    took_s = b_done.completed_at - b_done.created_at
    print(f"B's batch took {took_s} s; A's ended {a_done.completed_at - b_done.completed_at} s after B's")
    assert took_s <= 8, f"B's one-line batch took {took_s} s"
    assert a_done.completed_at - b_done.completed_at >= 5
