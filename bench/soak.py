"""Soak: 10,000 jobs through the local stack with the echo engine and several workers, one of them killed with SIGKILL
and restarted along the way. Not part of ``make test``: ``make soak``.

Passes when every job succeeded with exactly one result object, none is lost, and the RSS of a worker that ran
throughout is at the end within 10% of what it was after the first 1,000 jobs. Writes bench/results/soak.json and
ends with that JSON on one line. Notifications are counted too: a duplicate is allowed by the contract (a kill between
the SNS publish and the flag write) and reported, a missing one fails the run.
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
from async_inference.schemas import JobSubmission
from async_inference.service import JobService
from local_runtime.moto_server import free_port
from local_runtime.stack import LocalStack

RESULTS = Path(__file__).resolve().parent / "results"
KEY = "soak-tenant-key-0123456789"
WORKER_ENV = {"RECEIVE_WAIT_S": "1", "HEARTBEAT_INTERVAL_S": "3", "VISIBILITY_TIMEOUT_S": "15", "DRAIN_TIMEOUT_S": "5",
              "TRANSIENT_RETRY_DELAY_S": "1", "LOG_LEVEL": "WARNING"}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def succeeded_count(table: str) -> tuple[int, Counter[str]]:
    """Jobs by status (a full scan: moto answers it quickly enough for 10,000 items)."""
    dynamodb, statuses, kwargs = client("dynamodb"), Counter(), {}
    while True:
        page = dynamodb.scan(TableName=table, ProjectionExpression="#s", ExpressionAttributeNames={"#s": "status"},
                             **kwargs)
        statuses.update(item["status"]["S"] for item in page["Items"])
        if "LastEvaluatedKey" not in page:
            return statuses.get("succeeded", 0), statuses
        kwargs = {"ExclusiveStartKey": page["LastEvaluatedKey"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.soak")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=3_000, help="SIGKILL one worker once this many have succeeded")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(exist_ok=True)
    log = open(RESULTS / "soak-workers.log", "wb")
    stack = LocalStack(api_port=free_port(), moto_port=free_port(), api_keys={KEY: "soak"}, workers=0, engine="echo",
                       worker_env=WORKER_ENV, worker_log=log).start()
    started = time.monotonic()
    try:
        assert stack.resources is not None
        config = stack.resources.config
        sqs, sns = client("sqs"), client("sns")
        inbox = sqs.create_queue(QueueName="soak-inbox")["QueueUrl"]
        inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=config.topic_arn, Protocol="sqs", Endpoint=inbox_arn,
                      Attributes={"RawMessageDelivery": "true"})
        workers = [stack.start_worker() for _ in range(args.workers)]
        watched = workers[0]  # never killed: its RSS is the one compared
        service = JobService.from_config(config)
        request = {"model": "echo", "max_tokens": 4}

        # Watch progress in the background: RSS after the first 1,000, and the kill, happen while jobs still arrive.
        progress: dict = {"first_rss": None, "killed": None}
        finished = threading.Event()

        submitted = Counter()

        def depth() -> int:
            attributes = sqs.get_queue_attributes(QueueUrl=config.queue_url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
            return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

        def watch() -> None:
            # Progress from the queue depth (one cheap call); a table scan every few seconds would load moto more
            # than the workers do. The exact count is taken once, at the end.
            while not finished.is_set():
                finished.wait(2)
                done = submitted["n"] - depth()
                if progress["first_rss"] is None and done >= 1000:
                    progress["first_rss"] = rss_mb(watched.pid)
                if progress["killed"] is None and done >= args.kill_at:
                    victim = workers[-1]
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    progress["killed"] = {"at_done": done, "pid": victim.pid}
                    workers.append(stack.start_worker())  # ECS would start a replacement task
                print(f"{time.monotonic() - started:7.1f} s submitted {submitted['n']} done ~{done} "
                      f"rss {rss_mb(watched.pid):.1f} MB (after 1,000: {progress['first_rss']})", file=sys.stderr, flush=True)
                if (submitted["n"] >= args.jobs and done >= args.jobs) or time.monotonic() > started + args.timeout:
                    finished.set()

        def submit(_: int) -> str:
            job_id = service.submit("soak", submission, None).job.job_id
            submitted["n"] += 1  # Counter updates are atomic enough under the GIL for a progress figure
            return job_id

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # Jobs enter through JobService.submit, the core the API Lambda calls: the local gateway runs one handler
        # call at a time, which would make this a benchmark of the gateway rather than of the pipeline.
        submission = JobSubmission.model_validate(
            {"request": {**request, "messages": [{"role": "user", "content": "soak"}]}})
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            job_ids = list(pool.map(submit, range(args.jobs)))
        print(f"{time.monotonic() - started:7.1f} s all {len(job_ids)} submitted", file=sys.stderr, flush=True)
        watcher.join()
        for _ in range(30):  # the last notifications and flags may trail the queue emptying by a moment
            done, statuses = succeeded_count(config.table_name)
            if done >= args.jobs:
                break
            time.sleep(5)
        first_rss, killed = progress["first_rss"], progress["killed"]
        end_rss = rss_mb(watched.pid)
        elapsed = time.monotonic() - started

        # Effects: one result object per job, one final state per job, notifications counted by job.
        s3 = client("s3")
        results: Counter[str] = Counter()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=config.bucket_name, Prefix=settings.RESULT_PREFIX):
            results.update(o["Key"].split("/")[2] for o in page.get("Contents", []))
        notes: Counter[str] = Counter()
        quiet = time.monotonic()
        while time.monotonic() - quiet < 3:
            messages = sqs.receive_message(QueueUrl=inbox, MaxNumberOfMessages=10).get("Messages", [])
            if messages:
                quiet = time.monotonic()
                notes.update(json.loads(m["Body"])["job_id"] for m in messages)
                sqs.delete_message_batch(QueueUrl=inbox, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                                  for i, m in enumerate(messages)])
        figures = {
            "jobs": args.jobs,
            "workers": args.workers,
            "succeeded": done,
            "statuses": dict(statuses),
            "seconds": round(elapsed, 1),
            "jobs_per_s": round(args.jobs / elapsed, 1),
            "killed": killed,
            "result_objects": sum(results.values()),
            "jobs_without_result": sum(1 for j in job_ids if results[j] == 0),
            "jobs_with_more_than_one_result": sum(1 for j in job_ids if results[j] > 1),
            "notifications": sum(notes.values()),
            "jobs_not_notified": sum(1 for j in job_ids if notes[j] == 0),
            "duplicate_notifications": sum(max(0, notes[j] - 1) for j in job_ids),
            "watched_worker_rss_mb_after_1000": round(first_rss or 0, 1),
            "watched_worker_rss_mb_at_end": round(end_rss, 1),
            "rss_growth_pct": round(100 * (end_rss - (first_rss or end_rss)) / (first_rss or end_rss), 1),
        }
        figures["passed"] = (done == args.jobs and figures["jobs_without_result"] == 0
                             and figures["jobs_with_more_than_one_result"] == 0 and figures["jobs_not_notified"] == 0
                             and abs(figures["rss_growth_pct"]) <= 10)
        (RESULTS / "soak.json").write_text(json.dumps(figures, indent=2))
        print(json.dumps(figures))
        return 0 if figures["passed"] else 1
    finally:
        stack.stop()
        log.close()


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    sys.exit(main())
