"""``python -m tests.batchworker.standin_worker``: ``python -m gpu_worker`` with the STAND-IN BatchStore.

The batch table's adapter (``async_inference.batches.store.BatchStore``) is the API side's and not merged yet, so a
worker process with the batch lane gets ``bench.batch_standin.StandInBatchStore`` instead; everything else is the
worker's own entry point, settings and fault injection. Once the API side is merged, the tests start workers from
the task definition (``FaultStack.start_worker``) instead.
"""

from __future__ import annotations

import sys

from bench.batch_standin import StandInBatchStore
from gpu_worker import __main__ as worker_main


def standin_store(config: worker_main.WorkerSettings) -> StandInBatchStore | None:
    return StandInBatchStore(config.batch_table_name) if config.batch_table_name else None


if __name__ == "__main__":
    worker_main.batch_store = standin_store
    sys.exit(worker_main.run())
