"""``make demo``: the whole pipeline locally with the real model, two jobs (inline and presigned upload), their
results and the SNS notifications they produced. Exit status 0 only if every job succeeded."""

from __future__ import annotations

import json
import sys
import time

from async_inference.aws import client
from async_inference.cli import Progress
from async_inference.client import Client
from local_runtime.stack import LocalStack

MODEL = "SmolLM2-135M-Instruct"
INLINE_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for writing clear code.",
]
UPLOAD_PROMPT = "Explain in two sentences why the sky is blue."


def subscribe_queue(topic_arn: str) -> str:
    """An SQS queue subscribed to the result topic, standing in for a subscriber."""
    sqs, sns = client("sqs"), client("sns")
    url = sqs.create_queue(QueueName="demo-notifications")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    return url


def received_notifications(url: str, expected: int, timeout_s: float = 10.0) -> list[dict]:
    sqs = client("sqs")
    found: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < expected and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            found.append(json.loads(message["Body"]))
    return found


def run_demo(stack: LocalStack) -> int:
    print(f"Starting the local stack (moto server on {stack.moto.url}, API on {stack.api_url}, engine {stack.engine})...")
    with stack:
        assert stack.resources is not None
        notifications_url = subscribe_queue(stack.resources.config.topic_arn)
        api_key = next(iter(stack.api_keys))
        api = Client(stack.api_url, api_key)

        jobs = []
        for prompt in INLINE_PROMPTS:
            request = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 64, "temperature": 0}
            job = api.submit(request, metadata={"path": "inline"})
            print(f"submitted {job['job_id']} inline          -> {job['status']}")
            jobs.append((job["job_id"], prompt))
        body = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": UPLOAD_PROMPT}], "max_tokens": 64, "temperature": 0}
        ).encode()
        job = api.submit_upload(body, metadata={"path": "upload"})
        print(f"submitted {job['job_id']} by upload       -> {job['status']} (PUT {len(body)} bytes to the presigned URL)")
        jobs.append((job["job_id"], UPLOAD_PROMPT))

        print("waiting for the worker (the first job also waits for the model to load)...")
        finals = []
        for job_id, prompt in jobs:
            progress = Progress(sys.stdout)
            final = api.wait(job_id, timeout_s=600, on_poll=progress)
            progress.done()
            finals.append((final, prompt))

        print()
        for final, prompt in finals:
            print(f"== {final['job_id']}  {final['status']}  attempts={final['attempts']}")
            print(f"   prompt: {prompt}")
            if final["status"] == "succeeded":
                completion = api.result(final)
                print(f"   answer: {completion['choices'][0]['message']['content'].strip()}")
                print(f"   usage:  {completion['usage']}  finish_reason={completion['choices'][0]['finish_reason']}")
            else:
                print(f"   error:  {final.get('error')}")

        print("\nSNS notifications received by an SQS subscriber:")
        for note in received_notifications(notifications_url, expected=len(finals)):
            location = note.get("result_location") or {}
            print(f"   {note['job_id']} status={note['status']} tenant={note['tenant']} result=s3://{location.get('bucket')}/{location.get('key')}")

    ok = all(final["status"] == "succeeded" for final, _ in finals)
    print("\ndemo " + ("succeeded: every job finished with a result" if ok else "FAILED: not every job succeeded"))
    return 0 if ok else 1
