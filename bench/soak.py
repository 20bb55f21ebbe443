"""Soak: 10,000 jobs through the local stack with the echo engine and several workers, one of them killed with SIGKILL
and replaced along the way. Not part of ``make test``: ``make soak``.

Passes when every job ends ``succeeded`` with its result written exactly once and notified at least once, nothing is
left in the queues, and the RSS of a worker that ran throughout is at the end within 10% of what it was after the first
1,000 jobs. Writes bench/results/soak.json and ends with that JSON on one line.

How it is measured, and why so:
- Jobs enter through ``JobApi.submit``, the core the API Lambda calls (the local gateway runs one handler call at a
  time, which would make this a benchmark of the gateway), at most ``--backlog`` ahead of the notifications: a steady
  load over the whole run rather than one burst, so the queue stays as deep as a busy service's, and moto's
  ReceiveMessage (linear in queue depth) stays fast enough to get through 10,000 jobs in one sitting.
- Progress and the notification count come from an SQS queue subscribed to the result topic, drained as the run goes.
- "Exactly once" is checked on effects: the bucket is versioned, as the deployed one is, so every write of a result
  object leaves a version; each job must have exactly one. States are read back per job (BatchGetItem), not by a
  table scan, which slows moto down past use at this size.
- A duplicate notification is allowed by the contract (a kill between the SNS publish and the flag write,
  docs/guarantees.md) and reported; a missing one fails the run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from async_inference import settings
from async_inference.aws import client
from async_inference.config import ServiceSettings
from async_inference.jobs_service import JobService
from async_inference.schemas import JobSubmission
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalDeployment
from local_runtime.subscribers import subscribe_queue

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "soak-tenant-key-0123456789"
TENANT = "soak"
# The receive wait is the deployed one (20 s): at 1 s, the three workers' 15 receivers returning empty-handed were
# about 3 moto requests a job (docs/guarantees.md).
WORKER_ENV = {
    "HEARTBEAT_INTERVAL_S": "3",
    "VISIBILITY_TIMEOUT_S": "15",
    "DRAIN_TIMEOUT_S": "5",
    "TRANSIENT_RETRY_DELAY_S": "1",
    "LOG_LEVEL": "WARNING",
}
BATCH_GET_KEYS = 100  # DynamoDB's limit per BatchGetItem


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Subscriber(threading.Thread):
    """Drains a queue subscribed to the result topic and counts notifications by job id."""

    def __init__(self, queue_url: str) -> None:
        super().__init__(name="soak-subscriber", daemon=True)
        self.queue_url = queue_url
        self.notes: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.stopping = threading.Event()
        self._sqs = client("sqs")

    @property
    def notified(self) -> int:
        return len(self.notes)

    def run(self) -> None:
        while not self.stopping.is_set():
            self.receive_once(wait_s=1)

    def receive_once(self, wait_s: int) -> int:
        messages = self._sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s
        ).get("Messages", [])
        for message in messages:
            body = json.loads(message["Body"])
            self.notes[body["job_id"]] += 1
            self.statuses[body["status"]] += 1
        if messages:
            self._sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
        return len(messages)

    def drain(self, quiet_s: float) -> None:
        """Stop the thread and read on until the queue has been empty for ``quiet_s``."""
        self.stopping.set()
        self.join()
        quiet = time.monotonic()
        while time.monotonic() - quiet < quiet_s:
            if self.receive_once(wait_s=1):
                quiet = time.monotonic()


def final_states(table: str, job_ids: list[str]) -> tuple[Counter[str], Counter[int]]:
    """Each job's status and how many times a worker started it, read back by key."""
    dynamodb, statuses, attempts = client("dynamodb"), Counter(), Counter()
    for start in range(0, len(job_ids), BATCH_GET_KEYS):
        keys = [{settings.TABLE_PARTITION_KEY: {"S": j}} for j in job_ids[start : start + BATCH_GET_KEYS]]
        request = {
            table: {
                "Keys": keys,
                "ProjectionExpression": "#s, attempts",
                "ExpressionAttributeNames": {"#s": "status"},
                "ConsistentRead": True,
            }
        }
        found = 0
        while request:
            page = dynamodb.batch_get_item(RequestItems=request)
            items = page["Responses"].get(table, [])
            found += len(items)
            statuses.update(item["status"]["S"] for item in items)
            attempts.update(int(item.get("attempts", {"N": "0"})["N"]) for item in items)
            request = page.get("UnprocessedKeys") or {}
        statuses["missing"] += len(keys) - found
    if not statuses["missing"]:
        del statuses["missing"]
    return statuses, attempts


def result_writes(bucket: str) -> Counter[str]:
    """How many times each job's result object was written: one version per write in the versioned bucket."""
    writes: Counter[str] = Counter()
    pages = (
        client("s3")
        .get_paginator("list_object_versions")
        .paginate(Bucket=bucket, Prefix=f"{settings.RESULT_PREFIX}{TENANT}/")
    )
    for page in pages:
        writes.update(version["Key"].split("/")[2] for version in page.get("Versions", []))
    return writes


def queue_depths(urls: dict[str, str]) -> dict[str, int]:
    sqs, depths = client("sqs"), {}
    for name, url in urls.items():
        attributes = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )["Attributes"]
        depths[name] = sum(int(v) for v in attributes.values())
    return depths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.soak")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=300, help="most jobs submitted and not yet notified")
    parser.add_argument("--kill-at", type=int, default=3_000, help="SIGKILL one worker once this many are notified")
    parser.add_argument(
        "--rss-at", type=int, default=1_000, help="the RSS baseline is taken once this many are notified"
    )
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(exist_ok=True)
    log = open(RESULTS / "soak-workers.log", "wb")
    stack = LocalDeployment.with_tenants(
        {KEY: TENANT},
        api_port=free_port(),
        moto_port=free_port(),
        workers=0,
        engine="echo",
        worker_env=WORKER_ENV,
        worker_log=log,
    ).start()
    stack.export_env()
    started = time.monotonic()
    try:
        assert stack.resources is not None
        config = stack.resources.config  # its bucket is versioned, as the template's is: each write leaves a version
        subscriber = Subscriber(subscribe_queue(config.topic_arn, "soak-subscriber"))
        subscriber.start()
        workers = [stack.start_worker() for _ in range(args.workers)]
        watched = workers[0]  # never killed: its RSS is the one compared
        # The API function's own settings: its routes (the local engine's "*" route among them) find the queue.
        api = next(f for f in stack.functions.values() if f.handler == "lambdas.api.handler.lambda_handler")
        api_settings = ServiceSettings.load(**api.environment)
        service = JobService.from_config(api_settings.service, served_models=api_settings.served_models)
        submission = JobSubmission.model_validate(
            {"request": {"model": "echo", "max_tokens": 4, "messages": [{"role": "user", "content": "soak"}]}}
        )
        progress: dict = {"rss_baseline": None, "killed": None}
        submitted = Counter()
        done = threading.Event()

        def watch() -> None:
            while not done.wait(2):
                notified = subscriber.notified
                if progress["rss_baseline"] is None and notified >= args.rss_at:
                    progress["rss_baseline"] = {"at_notified": notified, "mb": rss_mb(watched.pid)}
                if progress["killed"] is None and notified >= args.kill_at:
                    victim = workers[-1]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    progress["killed"] = {"at_notified": notified, "pid": victim.pid}
                    workers.append(stack.start_worker())  # ECS would start a replacement task
                elapsed = time.monotonic() - started
                print(
                    f"{elapsed:7.1f} s submitted {submitted['n']} notified {notified} "
                    f"({notified / elapsed:.1f}/s) watched worker RSS {rss_mb(watched.pid):.1f} MB",
                    file=sys.stderr,
                    flush=True,
                )

        def submit(_: int) -> str:
            while submitted["n"] - subscriber.notified >= args.backlog:
                time.sleep(0.05)
            job_id = service.api.submit(TENANT, submission, None).job.job_id
            submitted["n"] += 1  # a progress figure; Counter updates under the GIL are close enough
            return job_id

        watcher = threading.Thread(target=watch, name="soak-watch", daemon=True)
        watcher.start()
        pool = concurrent.futures.ThreadPoolExecutor(4)
        try:
            job_ids = list(pool.map(submit, range(args.jobs)))
        finally:  # on Ctrl-C the submits not started are dropped (a plain `with` ran all 10,000 before stopping)
            pool.shutdown(cancel_futures=True)
        print(f"{time.monotonic() - started:7.1f} s all {len(job_ids)} submitted", file=sys.stderr, flush=True)
        deadline = started + args.timeout
        while subscriber.notified < len(set(job_ids)) and time.monotonic() < deadline:
            time.sleep(1)
        elapsed = time.monotonic() - started
        rss_end = rss_mb(watched.pid)
        done.set()
        watcher.join()
        # A redelivered copy of a job already finished by another worker may still be in flight: give it the
        # visibility timeout to come back and be settled before the books are closed.
        subscriber.drain(quiet_s=float(WORKER_ENV["VISIBILITY_TIMEOUT_S"]) + 5)
        states, attempts = final_states(config.table_name, job_ids)
        writes = result_writes(config.bucket_name)
        depths = queue_depths({"jobs": config.queue_url, "dead_letters": config.dlq_url})
        baseline = (progress["rss_baseline"] or {}).get("mb")
        figures = {
            "jobs": args.jobs,
            "distinct_job_ids": len(set(job_ids)),
            "workers": args.workers,
            "backlog": args.backlog,
            "seconds": round(elapsed, 1),
            "jobs_per_s": round(args.jobs / elapsed, 1),
            "killed": progress["killed"],
            "final_states": dict(states),
            # Started by a worker more than once: the jobs the killed worker held, finished by another.
            "jobs_by_times_started": {str(n): count for n, count in sorted(attempts.items())},
            "result_writes": sum(writes.values()),
            "jobs_without_result": sum(1 for j in job_ids if writes[j] == 0),
            "jobs_with_result_written_more_than_once": sum(1 for j in job_ids if writes[j] > 1),
            "notifications": sum(subscriber.notes.values()),
            "notification_statuses": dict(subscriber.statuses),
            "jobs_not_notified": sum(1 for j in job_ids if subscriber.notes[j] == 0),
            "duplicate_notifications": sum(max(0, subscriber.notes[j] - 1) for j in job_ids),
            "queue_depths_at_end": depths,
            "watched_worker_rss_baseline": progress["rss_baseline"],
            "watched_worker_rss_mb_at_end": round(rss_end, 1),
            "rss_growth_pct": round(100 * (rss_end - baseline) / baseline, 1) if baseline else None,
        }
        figures["passed"] = (
            figures["distinct_job_ids"] == args.jobs
            and states == Counter({"succeeded": args.jobs})
            and figures["jobs_without_result"] == 0
            and figures["jobs_with_result_written_more_than_once"] == 0
            and figures["jobs_not_notified"] == 0
            and set(subscriber.statuses) == {"succeeded"}
            and not any(depths.values())
            and progress["killed"] is not None
            and figures["rss_growth_pct"] is not None
            and abs(figures["rss_growth_pct"]) <= 10
        )
        (RESULTS / "soak.json").write_text(json.dumps(figures, indent=2) + "\n")
        print(json.dumps(figures))
        return 0 if figures["passed"] else 1
    finally:
        stack.stop()
        log.close()


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    sys.exit(main())
