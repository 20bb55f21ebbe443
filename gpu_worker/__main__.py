"""``python -m gpu_worker``: run a worker until SIGTERM or SIGINT.

Exit status: 0 after a stop (SIGTERM/SIGINT) and its drain; 2 when the settings are missing or malformed (the message
names the variables); 3 (``EXIT_ENGINE_DEAD``) when the engine died: the worker handed every message it held back,
unfailed, and its supervisor (ECS, replacing the task) must start a fresh process; 4 (``EXIT_START_TIMEOUT``) when the
model's sync and the engine's start outlasted ``WORKER_START_TIMEOUT_S`` (it held no message yet).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from async_inference.config import SettingsError
from gpu_worker.config import WorkerSettings
from gpu_worker.deployments import DeploymentWatch
from gpu_worker.engines import make_engine
from gpu_worker.faults import Faults
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.model_source import ModelSource
from gpu_worker.task_protection import TaskProtection
from gpu_worker.worker import EXIT_ENGINE_DEAD, Worker

EXIT_BAD_SETTINGS = 2


def batch_store(config: WorkerSettings) -> Any:
    """The batch table's BatchStore, for a worker with the batch lane (None without it). Imported here, not at the top:
    the batch side (async_inference/batches) is not needed by a worker that serves the interactive lane only."""
    if not config.batch_table_name:
        return None
    from async_inference.batches.store import BatchStore

    return BatchStore(config.batch_table_name)


async def main(config: WorkerSettings) -> int:
    worker = Worker(
        config.worker_config(),
        make_engine(config.engine, kind=config.model_kind, **config.engine_options()),
        protection=TaskProtection(config.ecs_agent_uri),
        faults=Faults.parse(config.worker_faults),
        metrics=WorkerMetrics(config.metrics_namespace),
        model_source=ModelSource(config.model_s3_uri, config.model_dir)
        if config.model_s3_uri and config.model_dir
        else None,
        batches=batch_store(config),
        deployments=DeploymentWatch(config.ecs_metadata_uri, interval_s=config.deployment_check_interval_s),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()
    return EXIT_ENGINE_DEAD if worker.engine_dead is not None else 0


def run() -> int:
    try:
        config = WorkerSettings.load()
    except SettingsError as exc:
        print(f"gpu_worker: cannot start: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_SETTINGS
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # its INFO lines (credentials, endpoints) are noise here
    return asyncio.run(main(config))


if __name__ == "__main__":  # vLLM spawns processes: nothing may start on import
    sys.exit(run())
