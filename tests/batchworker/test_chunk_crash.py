"""A worker killed with SIGKILL inside a chunk loses no line and duplicates none: each custom_id is in the batch's
output and error files together exactly once, and every object the worker writes is written once."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.batchworker.conftest import BatchStack, lines
from tests.faults.fault_stack import wait_until

pytestmark = pytest.mark.e2e

# Points of a chunk's life (gpu_worker/faults.py), in order; before "after_chunk_results" nothing of it is stored.
STORED = ("after_chunk_results", "between_parts", "after_chunk_recorded", "before_delete")


@pytest.mark.parametrize("point", ["in_chunk", *STORED])
def test_a_worker_killed_inside_a_chunk_leaves_each_custom_id_exactly_once(batches: BatchStack, point: str):
    # GIVEN a batch of two chunks, planned by the template's controller, and a worker (`python -m gpu_worker` from
    # the task definition) that is killed when its first chunk reaches `point`
    batch = batches.submit(lines(150))
    doomed = batches.fstack.start_worker(f"crash-{point}", WORKER_FAULTS=f"crash={point}", ECHO_DELAY_S="0.05")
    wait_until(lambda: doomed.poll() is not None, 60, "the faulty worker to die")
    # WHEN another worker takes the chunks over: one whose engine refuses every line (its context is too short), so
    # a line the killed worker had generated and stored could only reach an error part by being run a second time
    survivor = batches.fstack.start_worker(f"survivor-{point}", ECHO_MAX_MODEL_LEN="100")
    record = batches.wait_final(batch, timeout_s=60)
    wait_until(lambda: batches.batch_queue_depth() == 0, 30, "the killed worker's chunks to be consumed")

    # THEN it really was killed there
    assert doomed.returncode == -signal.SIGKILL
    log = doomed.log_path.read_text()
    assert f"SIGKILL at {point} of {batch.batch_id}/" in log
    killed_chunk = int(log.split(f"SIGKILL at {point} of {batch.batch_id}/")[1].split()[0])
    # AND the controller finalized the batch: every custom_id is in its output and error files together exactly once
    assert record.status.value == "completed"
    outputs, errors = batches.files(record)
    seen = Counter(line["custom_id"] for line in outputs + errors)
    assert seen == Counter(f"req-{i}" for i in range(150))
    assert (record.completed, record.failed, record.total) == (len(outputs), len(errors), 150)
    # AND a chunk whose results were stored before the kill kept them: its lines are the killed worker's successes
    killed_part = batches.part(batch, killed_chunk, "output")
    if point in STORED:
        assert killed_part is not None and len(killed_part) == min(100, 150 - 100 * killed_chunk)
    else:
        assert killed_part == []  # nothing was stored: the survivor ran it, and its engine refused every line
    # AND nothing the worker writes was written twice (one S3 version per results object and part)
    keys = batches.batch_keys(batch)
    assert len(keys) == 3 * batch.chunks
    assert {key: batches.versions(key) for key in keys} == {key: 1 for key in keys}
    batches.fstack.stop_worker(survivor)
