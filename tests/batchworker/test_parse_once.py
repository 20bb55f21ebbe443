"""Each queue body is parsed once, into its claim (issue #18): the pump parses it as it receives it, and neither the
runner nor the chunk runner reads the body again."""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest

from async_inference.schemas import ChunkClaimCheck, ClaimCheck
from gpu_worker import claims
from gpu_worker.engines.echo import EchoEngine
from tests.batchworker.conftest import AwsRequests, BatchStack, lines
from tests.faults.fault_stack import chat

pytestmark = pytest.mark.e2e


class CountingAdapter:
    """The claims union's TypeAdapter, remembering every body it parsed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bodies: list[str] = []

    def validate_json(self, body: str, *args: Any, **kwargs: Any) -> Any:
        self.bodies.append(body)
        return self.inner.validate_json(body, *args, **kwargs)


@pytest.mark.parametrize(
    "delay_s",
    [
        pytest.param(0.0, id="fast"),
        # a chunk outlasts the scout's first look (0.5 s): when the other chunk, of the same tenant, is still queued
        # then, the scout receives and requeues it, so that body is received twice (how the CI run of 2026-12-02 saw
        # it, on a loaded machine; whether the worker's own receive took both chunks first depends on timing)
        pytest.param(0.2, id="slow-chunk-maybe-requeued-by-the-scout"),
    ],
)
def test_each_message_of_either_lane_is_parsed_once(
    batches: BatchStack, monkeypatch: pytest.MonkeyPatch, delay_s: float
):
    # GIVEN a batch of two chunks on the batch lane and three jobs on the job queue, and every parse of a claim counted:
    # the union's and each claim model's own
    batch = batches.submit(lines(150))
    api = batches.fstack.api()
    job_ids = [api.submit(chat(f"parsed once {i}")).job_id for i in range(3)]
    adapter = CountingAdapter(claims._ADAPTER)
    monkeypatch.setattr(claims, "_ADAPTER", adapter)
    direct: list[str] = []
    for model in (ClaimCheck, ChunkClaimCheck):
        original = model.model_validate_json

        def counting(body: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            direct.append(body)
            return _original(body, *args, **kwargs)

        monkeypatch.setattr(model, "model_validate_json", counting)
    # WHEN a worker with both lanes runs them all
    with AwsRequests().installed() as requests, batches.worker(EchoEngine(capacity=16, delay_s=delay_s)) as worker:
        deadline = time.monotonic() + 60
        while (worker.jobs_finished < 3 or not batches.record(batch).all_counted) and time.monotonic() < deadline:
            time.sleep(0.1)
    received = [
        m["Body"] for op, _, result in requests.calls if op == "ReceiveMessage" for m in result.get("Messages", [])
    ]
    # THEN every job ran and every chunk was counted
    assert worker.jobs_finished == 3 and batches.record(batch).all_counted
    assert sum(1 for body in received if any(job_id in body for job_id in job_ids)) == 3
    # AND each body the worker received was parsed exactly once per receive, by the union, and never by a claim model
    # itself (a body the scout requeued is received, and parsed, once more: that is a second message, not a re-parse)
    assert len(set(received)) == batch.chunks + 3
    twice = [body for body, count in collections.Counter(received).items() if count > 1]
    assert all('"kind":"batch_chunk"' in body for body in twice), "only the scout's requeue receives a body again"
    assert sorted(adapter.bodies) == sorted(received)
    assert direct == []
