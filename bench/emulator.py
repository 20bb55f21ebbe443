"""``python -m bench.emulator``: what the local AWS emulator can sustain on this machine, to read `make bench` by.

Prints ReceiveMessage latency with a backlog queued (the worker's start-up ramp is bounded by it) and the rate of
GetQueueAttributes calls moto server answers with 8 callers.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import time

from async_inference.aws import JobQueue, client
from async_inference.config import ServiceSettings
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backlog", type=int, default=640)
    args = parser.parse_args()
    stack = LocalDeployment.with_tenants(
        {"emulator-probe-key-0123": "probe"}, api_port=free_port(), moto_port=free_port(), workers=0
    )
    with stack:
        stack.export_env()
        config = ServiceSettings.load().service
        sqs = client("sqs")
        for _ in range(0, args.backlog, 10):
            sqs.send_message_batch(
                QueueUrl=config.queue_url, Entries=[{"Id": str(i), "MessageBody": "x" * 300} for i in range(10)]
            )
        queue = JobQueue(config.queue_url)
        latencies = []
        for _ in range(10):
            start = time.perf_counter()
            queue.receive(max_messages=10, wait_s=0, visibility_timeout_s=60)
            latencies.append(time.perf_counter() - start)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            start = time.perf_counter()
            list(
                pool.map(
                    lambda _: sqs.get_queue_attributes(QueueUrl=config.queue_url, AttributeNames=["QueueArn"]),
                    range(200),
                )
            )
            rate = 200 / (time.perf_counter() - start)
    print(f"ReceiveMessage (10 messages, {args.backlog} queued): p50 {statistics.median(latencies) * 1000:.0f} ms")
    print(f"GetQueueAttributes with 8 callers: {rate:.0f} requests/s")


if __name__ == "__main__":
    main()
