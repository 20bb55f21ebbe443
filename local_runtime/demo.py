"""``make demo``: the whole pipeline locally with the real model, jobs inline and by presigned upload, their results,
the SNS notifications they produced, one job's webhook delivered to a local receiver and verified, and a background
response created and polled with the official ``openai`` SDK, unmodified, a chat completion streamed with it as it
decodes, and an embeddings job run by the embedding
model's own fleet (the real all-MiniLM-L6-v2). Exit status 0 only if every job succeeded, the webhook verified, the
response answered and the embeddings came back."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import openai
from standardwebhooks import Webhook, WebhookVerificationError

from async_inference.webhooks.receiver import Receiver
from async_inference_client import Client
from async_inference_client.cli import Progress
from local_runtime.stack import LocalDeployment
from local_runtime.subscribers import subscribe_queue

MODEL = "SmolLM2-135M-Instruct"
INLINE_PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for writing clear code.",
]
UPLOAD_PROMPT = "Explain in two sentences why the sky is blue."
RESPONSE_PROMPT = "Name three primary colours."
STREAM_PROMPT = "Write two sentences about the sea."
EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # the demo template's second model (cdk/cdk.mk)
EMBEDDING_TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply."]


def received_notifications(sqs: Any, url: str, expected: int, timeout_s: float = 10.0) -> list[dict]:
    found: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < expected and time.monotonic() < deadline:
        for message in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", []):
            found.append(json.loads(message["Body"]))
    return found


def run_demo(stack: LocalDeployment) -> int:
    print(
        f"Starting the local stack (moto server on {stack.moto.url}, API on {stack.api_url}, engine {stack.engine})..."
    )
    with stack:
        assert stack.resources is not None
        notifications_url = subscribe_queue(
            stack.resources.config.topic_arn, "demo-notifications", sqs=stack.client("sqs"), sns=stack.client("sns")
        )
        api_key = next(iter(stack.api_keys))
        api = Client(stack.api_url, api_key)
        receiver = Receiver().start()  # stands in for a product team's webhook endpoint

        jobs = []
        for i, prompt in enumerate(INLINE_PROMPTS):
            request = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 64,
                "temperature": 0,
            }
            webhook = {"url": receiver.url, "events": ["completed"]} if i == 0 else None
            job = api.submit(request, metadata={"path": "inline"}, webhook=webhook)
            print(
                f"submitted {job.job_id} inline          -> {job.status.value}"
                + (f" (webhook {receiver.url})" if webhook else "")
            )
            jobs.append((job.job_id, prompt))
        body = json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": UPLOAD_PROMPT}],
                "max_tokens": 64,
                "temperature": 0,
            }
        ).encode()
        job = api.submit_upload(body, metadata={"path": "upload"})
        print(
            f"submitted {job.job_id} by upload       -> {job.status.value} (PUT {len(body)} bytes to the presigned URL)"
        )
        jobs.append((job.job_id, UPLOAD_PROMPT))

        print("waiting for the worker (the first job also waits for the model to load)...")
        finals = []
        for job_id, prompt in jobs:
            progress = Progress(sys.stdout)
            final = api.wait(job_id, timeout_s=600, on_update=progress)
            progress.done()
            finals.append((final, prompt))

        print()
        for final, prompt in finals:
            print(f"== {final.job_id}  {final.status.value}  attempts={final.attempts}")
            print(f"   prompt: {prompt}")
            if final.status == "succeeded":
                completion = api.result(final)
                print(f"   answer: {completion.choices[0].message.content.strip()}")
                print(
                    f"   usage:  {completion.usage.model_dump()}  finish_reason={completion.choices[0].finish_reason}"
                )
            else:
                print(f"   error:  {final.error}")

        print("\nSNS notifications received by an SQS subscriber:")
        for note in received_notifications(stack.client("sqs"), notifications_url, expected=len(finals)):
            location = note.get("result_location") or {}
            print(
                f"   {note['job_id']} status={note['status']} tenant={note['tenant']} result=s3://{location.get('bucket')}/{location.get('key')}"
            )

        webhook_ok = show_webhook(api, receiver, jobs[0][0], stack.webhook_secrets[stack.api_keys[api_key]])
        receiver.stop()
        sdk = openai.OpenAI(base_url=stack.api_url + "/v1", api_key=api_key)
        response_ok = show_background_response(sdk)
        stream_ok = show_streamed_chat(sdk)
        embeddings_ok = show_embeddings(api)

    ok = all(final.status == "succeeded" for final, _ in finals) and webhook_ok and response_ok and embeddings_ok
    ok = ok and stream_ok
    print(
        "\ndemo "
        + (
            "succeeded: every job finished with a result, the webhook verified, the background response answered, "
            "the chat streamed and the embeddings came back"
            if ok
            else "FAILED: see above"
        )
    )
    return 0 if ok else 1


def show_webhook(api: Client, receiver: Receiver, job_id: str, secret: str) -> bool:
    """Print the webhook the receiver got for ``job_id``, verified with the tenant's secret; True when it verified."""
    print("\nWebhook received by a local endpoint:")
    delivery = next((d for d in receiver.wait_for(1, timeout_s=30) if job_id in d.headers.get("webhook-id", "")), None)
    if delivery is None:
        print(f"   FAILED: no delivery for {job_id} within 30 s")
        return False
    try:
        payload = Webhook(secret).verify(delivery.body, delivery.headers)
    except WebhookVerificationError as exc:
        print(f"   FAILED: the signature did not verify: {exc}")
        return False
    print(
        f"   webhook-id={delivery.headers['webhook-id']} signature verified with the tenant's whsec_ secret, which "
        "the deploy generated (read back from Secrets Manager, as `python -m async_inference.cli webhook-secret` "
        "reads it)"
    )
    print(
        f"   body: event={payload['event']} job_id={payload['job_id']} status={payload['status']}"
        f" result inline={'result' in payload}"
    )
    deadline = time.monotonic() + 10
    state = api.get(job_id).webhook
    while state.status == "pending" and time.monotonic() < deadline:
        time.sleep(0.2)
        state = api.get(job_id).webhook
    codes = [a.status_code for a in state.attempts]
    print(f"   GET /v1/jobs/{job_id} -> webhook status={state.status} attempts={codes}")
    return state.status == "delivered"


def show_background_response(sdk: openai.OpenAI, timeout_s: float = 300.0) -> bool:
    """Create a background response with the official SDK and poll it as OpenAI's docs do; True when it answered."""
    print("\nA background response, with the official openai SDK (client.responses.create(background=True)):")
    response = sdk.responses.create(
        model=MODEL, input=RESPONSE_PROMPT, max_output_tokens=48, temperature=0, background=True
    )
    print(f"   created {response.id} -> {response.status}")
    deadline = time.monotonic() + timeout_s
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.5)
        response = sdk.responses.retrieve(response.id)
    print(f"   retrieved {response.id} -> {response.status}")
    if response.status not in ("completed", "incomplete"):
        print(f"   FAILED: {response.error}")
        return False
    print(f"   output_text: {response.output_text.strip()}")
    usage = response.usage
    print(
        f"   usage: input_tokens={usage.input_tokens} output_tokens={usage.output_tokens}" if usage else "   no usage"
    )
    return bool(response.output_text)  # completed, or incomplete at max_output_tokens: an answer either way


def show_streamed_chat(sdk: openai.OpenAI) -> bool:
    """Stream one chat completion with the official SDK (``stream=True``), printing each delta as it comes; True when
    it streamed an answer."""
    print("\nA streamed chat completion, with the official openai SDK (client.chat.completions.create(stream=True)):")
    started, first, text = time.monotonic(), None, ""
    print("   ", end="", flush=True)
    for chunk in sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": STREAM_PROMPT}], max_tokens=48, temperature=0, stream=True
    ):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first if first is not None else time.monotonic() - started
            text += delta
            print(delta, end="", flush=True)
    print()
    if first is None:
        print("   FAILED: the stream carried no text")
        return False
    print(f"   first token after {first:.2f} s, the whole answer after {time.monotonic() - started:.2f} s")
    return True


def show_embeddings(api: Client) -> bool:
    """Submit an embeddings job for the embedding model (its own fleet), wait, print its vectors' likeness."""
    print("\nAn embeddings job, run by the embedding model's fleet:")
    job = api.submit({"model": EMBEDDING_MODEL, "input": EMBEDDING_TEXTS}, endpoint="/v1/embeddings")
    final = api.wait(job.job_id, timeout_s=300)
    print(f"   {final.job_id} {final.status.value}")
    if final.status != "succeeded":
        print(f"   FAILED: {final.error}")
        return False
    answer = api.embeddings(final)
    vectors = [d.vector() for d in answer.data]
    print(
        f"   {len(vectors)} vectors of {len(vectors[0])} values from {answer.model}, {answer.usage.prompt_tokens} tokens"
    )
    for i, j in ((0, 1), (0, 2)):
        similarity = sum(a * b for a, b in zip(vectors[i], vectors[j], strict=True))  # unit vectors: the cosine
        print(f"   cosine({EMBEDDING_TEXTS[i]!r}, {EMBEDDING_TEXTS[j]!r}) = {similarity:.3f}")
    return len(vectors) == len(EMBEDDING_TEXTS)
