"""``async-inference smoke`` (``make smoke``): one job through a deployed stack, from its outputs to the answer.

The deploy proves the API, queues and tables; it does not prove the worker image, the GPU or the model, because the
worker service is created at 0 tasks (docs/deploying.md, "The first deploy starts no GPU task"). The first job does,
and this command is that job, timed step by step:

1. The stack's outputs (CloudFormation DescribeStacks, or a ``cdk deploy --outputs-file`` file): ``ApiUrl`` and the
   tenant's ``ApiKeyId<tenant>``. The key's value stays in API Gateway, read with GetApiKey (``includeValue``).
   ``--api-url`` and ``--api-key`` skip this (the local stack prints both).
2. ``GET /v1/models``: the model to ask (``--model``, or the first listed); a model whose GPU launches fail says why
   there (``capacity``), and the command prints it.
3. ``POST /v1/jobs``, then the job followed until it ends (``--timeout``, default 20 minutes: a wake from zero takes
   about 2 minutes from the warm pool, 10 without it): the time it stayed queued (the wake), the time it ran, and
   the answer.

Exit status 0 when the job succeeded; 1 when it failed (the job's error is printed); 5 when it did not end in time
(the job goes on: ``async-inference-client status JOB``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2

from async_inference_client import Client
from async_inference_client._base_client import API_KEY_HEADER
from async_inference_client.cli import EXIT_NO_RESULT, EXIT_OK, EXIT_WAIT_TIMEOUT, CliError, emit
from async_inference_client.errors import WaitTimeout
from async_inference_client.models.batches import ModelList
from async_inference_client.types import JobUpdate

API_URL_OUTPUT = "ApiUrl"
API_KEY_OUTPUT_PREFIX = "ApiKeyId"  # cdk/stack.py: ApiKeyId<tenant without dashes>, the tenant's first key
DEFAULT_STACK_NAME = "AsyncInference"
DEFAULT_TIMEOUT_S = 1200.0
PROMPT = "Say hello in five words."


@dataclass(frozen=True)
class Target:
    """Where the smoke job goes: the API's stage URL (``ApiUrl``, under which the routes are ``/v1/...``) and a
    tenant's key."""

    api_url: str
    api_key: str
    tenant: str


def stack_outputs(cloudformation: Any, stack_name: str) -> dict[str, str]:
    """The stack's outputs, by key."""
    [stack] = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    return {output["OutputKey"]: output["OutputValue"] for output in stack.get("Outputs", [])}


def target_from_outputs(outputs: dict[str, str], tenant: str | None, apigateway: Any) -> Target:
    """The API URL and a tenant's key value from the stack's outputs: ``tenant``'s key, or the first tenant's."""
    if API_URL_OUTPUT not in outputs:
        raise CliError(f"the stack has no {API_URL_OUTPUT} output: is it this service's stack?")
    keys = {
        name.removeprefix(API_KEY_OUTPUT_PREFIX): key_id
        for name, key_id in sorted(outputs.items())
        if name.startswith(API_KEY_OUTPUT_PREFIX)
    }
    if not keys:
        raise CliError(f"the stack has no {API_KEY_OUTPUT_PREFIX}<tenant> output: give it tenants (the tenants option)")
    wanted = tenant.replace("-", "") if tenant else next(iter(keys))
    if wanted not in keys:
        raise CliError(f"the stack has no key for tenant {tenant!r}; its tenants' keys: {', '.join(keys)}")
    value = apigateway.get_api_key(apiKey=keys[wanted], includeValue=True)["value"]
    return Target(api_url=outputs[API_URL_OUTPUT].rstrip("/"), api_key=value, tenant=wanted)


def run_smoke(target: Target, *, model: str | None, timeout_s: float, say: Callable[[str], None]) -> dict[str, Any]:
    """One job through the API at ``target``, each step said as it ends; the figures, with ``status`` the job's."""
    base = target.api_url.rstrip("/")
    with Client(base, target.api_key) as api:
        started = time.monotonic()
        listing = httpx2.get(f"{base}/v1/models", headers={API_KEY_HEADER: target.api_key}, timeout=30)
        models = ModelList.model_validate(listing.raise_for_status().json())
        if not models.data:
            raise CliError("GET /v1/models lists no model")
        chosen = model or models.data[0].id
        listed = next((m for m in models.data if m.id == chosen), None)
        if listed is None:
            raise CliError(f"the stack does not serve {chosen!r}; it serves {', '.join(m.id for m in models.data)}")
        say(f"model {chosen} (of {len(models.data)}; GET /v1/models in {time.monotonic() - started:.2f} s)")
        if listed.capacity is not None:
            say(f"  its GPU launches fail: {listed.capacity.reason} (jobs stay queued until that is fixed)")
        body = {"model": chosen, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 32, "temperature": 0}
        submitted = time.monotonic()
        job = api.submit(body)
        say(f"job {job.job_id} {job.status.value} (submitted in {time.monotonic() - submitted:.2f} s)")
        seen: dict[str, float] = {job.status.value: time.monotonic()}

        def on_update(update: JobUpdate) -> None:
            status = update.status.value
            if status not in seen:
                seen[status] = time.monotonic()
                say(f"  {status} after {seen[status] - submitted:.1f} s")

        try:
            ended = api.wait(job.job_id, timeout_s=timeout_s, on_update=on_update)
        except WaitTimeout:
            return {"job_id": job.job_id, "model": chosen, "status": "timed_out", "waited_s": timeout_s}
        figures: dict[str, Any] = {
            "job_id": job.job_id,
            "model": chosen,
            "status": ended.status.value,
            "submit_to_end_s": round(time.monotonic() - submitted, 2),
        }
        if ended.started_at is not None:
            figures["queued_s"] = round((ended.started_at - ended.created_at).total_seconds(), 2)
        if ended.finished_at is not None and ended.started_at is not None:
            figures["ran_s"] = round((ended.finished_at - ended.started_at).total_seconds(), 2)
        if ended.status.value == "succeeded":
            figures["answer"] = api.result(ended).choices[0].message.content
        else:
            figures["error"] = ended.error
        return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack-name", default=DEFAULT_STACK_NAME, help=f"the stack ({DEFAULT_STACK_NAME})")
    parser.add_argument("--tenant", help="whose key to use (default: the first tenant's)")
    parser.add_argument("--api-url", help="the API's URL (the ApiUrl output); with --api-key, no AWS call is made")
    parser.add_argument("--api-key", help="a tenant's API key value")
    parser.add_argument("--model", help="the model to ask (default: the first GET /v1/models lists)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=f"seconds to follow the job ({DEFAULT_TIMEOUT_S:g})"
    )


def run(args: argparse.Namespace, client: Callable[[str], Any] | None = None) -> int:
    """The smoke job ``args`` ask for, with ``client`` (default: the adapters' boto3 clients) for the
    stack's outputs and key; the exit status."""
    if bool(args.api_url) != bool(args.api_key):
        raise CliError("--api-url and --api-key go together (or neither: the stack's outputs give both)")
    if args.api_url:
        target = Target(api_url=args.api_url, api_key=args.api_key, tenant=args.tenant or "")
    else:
        if client is None:
            from async_inference.aws import client as aws_client

            client = aws_client
        outputs = stack_outputs(client("cloudformation"), args.stack_name)
        target = target_from_outputs(outputs, args.tenant, client("apigateway"))
    lines: list[str] = []

    def say(line: str) -> None:
        if not getattr(args, "json", False):
            print(line, flush=True)
        lines.append(line)

    say(f"API {target.api_url}" + (f", tenant {target.tenant}'s key" if target.tenant else ""))
    figures = run_smoke(target, model=args.model, timeout_s=args.timeout, say=say)
    emit(args, figures, lambda: [_summary(figures)])
    if figures["status"] == "timed_out":
        return EXIT_WAIT_TIMEOUT
    return EXIT_OK if figures["status"] == "succeeded" else EXIT_NO_RESULT


def _summary(figures: dict[str, Any]) -> str:
    if figures["status"] == "timed_out":
        return f"job {figures['job_id']} did not end within {figures['waited_s']:g} s; it goes on"
    timing = f"queued {figures.get('queued_s', '?')} s, ran {figures.get('ran_s', '?')} s"
    if figures["status"] == "succeeded":
        return f"succeeded in {figures['submit_to_end_s']} s ({timing}): {figures['answer']!r}"
    return f"{figures['status']} after {figures['submit_to_end_s']} s ({timing}): {figures.get('error')}"
