"""``python -m gpu_worker``: run a worker until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from gpu_worker.engines import make_engine
from gpu_worker.worker import Worker, WorkerConfig


async def main() -> None:
    config = WorkerConfig.from_env()
    worker = Worker(config, make_engine(config.engine))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await worker.run()


if __name__ == "__main__":  # vLLM spawns processes: nothing may start on import
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # its INFO lines (credentials, endpoints) are noise here
    asyncio.run(main())
