"""`cli dlq list` shows what is in a DLQ without moving it; `cli dlq redrive` moves its claim checks back."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

from async_inference.jobs import new_job_id
from async_inference.schemas import ClaimCheck
from local_runtime.moto_server import free_port
from tests.faults.fault_stack import REPO_ROOT, TENANT, FaultStack


def cli(stack: FaultStack, *args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "async_inference.cli", "--json", *args],
        env=stack.env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, json.loads(done.stdout)


def test_dlq_list_then_redrive(fstack: FaultStack):
    # GIVEN a DLQ (its own pair of queues: the stack's DLQ handler would consume the real one) holding two claim
    # checks and one message that is not a claim check
    sqs = fstack.client("sqs")
    dlq = sqs.create_queue(QueueName=f"cli-dlq-{free_port()}")["QueueUrl"]
    main = sqs.create_queue(QueueName=f"cli-main-{free_port()}")["QueueUrl"]
    claims = [
        ClaimCheck(
            job_id=new_job_id(TENANT),
            tenant=TENANT,
            bucket="b",
            key=f"k{i}",
            model="m",
            deadline=dt.datetime.now(dt.UTC),
            timeout_s=60,
        )
        for i in range(2)
    ]
    for body in [c.model_dump_json() for c in claims] + ["not a claim check"]:
        sqs.send_message(QueueUrl=dlq, MessageBody=body)

    # WHEN an operator lists it
    code, listing = cli(fstack, "dlq", "list", "--dlq-url", dlq)
    # THEN every message is shown with its job, and all of them are still in the DLQ, visible
    assert code == 0 and listing["count"] == 3
    assert {m.get("job_id") for m in listing["messages"]} == {c.job_id for c in claims} | {None}
    assert fstack.queue_depth(dlq) == 3
    assert (
        int(
            sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
                "ApproximateNumberOfMessages"
            ]
        )
        == 3
    )

    # WHEN the operator redrives it
    code, redrive = cli(fstack, "dlq", "redrive", "--dlq-url", dlq, "--queue-url", main)
    # THEN the claim checks are on the job queue, and the message that is not one stays in the DLQ (exit code 1)
    assert code == 1 and redrive["redriven"] == 2 and len(redrive["left_in_dlq"]) == 1
    moved = sqs.receive_message(QueueUrl=main, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert {ClaimCheck.model_validate_json(m["Body"]).job_id for m in moved} == {c.job_id for c in claims}
    assert fstack.queue_depth(dlq) == 1
