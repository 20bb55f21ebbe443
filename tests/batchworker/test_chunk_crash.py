"""A worker killed with SIGKILL inside a chunk loses no line and duplicates none: each custom_id is in the output and
error parts together exactly once, and every object the worker writes is written once."""

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
    # GIVEN a batch of two chunks, and a worker that is killed when its first chunk reaches `point`
    batch = batches.submit(lines(150))
    doomed = batches.start_process_worker(f"crash-{point}", WORKER_FAULTS=f"crash={point}", ECHO_DELAY_S="0.05")
    wait_until(lambda: doomed.poll() is not None, 60, "the faulty worker to die")
    # WHEN another worker takes the chunks over: one whose engine refuses every line (its context is too short), so
    # a line the killed worker had generated and stored could only reach an error part by being run a second time
    survivor = batches.start_process_worker(f"survivor-{point}", ECHO_MAX_MODEL_LEN="100")
    item = batches.wait_counted(batch, timeout_s=60)
    wait_until(lambda: batches.batch_queue_depth() == 0, 30, "the killed worker's chunks to be consumed")

    # THEN it really was killed there
    assert doomed.returncode == -signal.SIGKILL
    log = doomed.log_path.read_text()
    assert f"SIGKILL at {point} of {batch.batch_id}/" in log
    killed_chunk = int(log.split(f"SIGKILL at {point} of {batch.batch_id}/")[1].split()[0])
    # AND every custom_id is in the output and error parts together exactly once
    outputs, errors = batches.results(batch)
    seen = Counter(line["custom_id"] for line in outputs + errors)
    assert seen == Counter(f"req-{i}" for i in range(150))
    assert (item["completed"], item["failed"]) == (len(outputs), len(errors))
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
    # AND the controller was told to finalize (at least once: finalize is idempotent)
    assert {f.batch_id for f in batches.finalizes()} == {batch.batch_id}
    batches.fstack.stop_worker(survivor)
