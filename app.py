#!/usr/bin/env python3
"""CDK entry point: reads the deploy-time options from context (cdk.json or -c), validates them, builds the stack.

Every option is a field of ``AsyncInferenceServiceProps`` (documented and defaulted there) under the same name in
context. ``-c name=value`` gives strings, so values are converted by the field's type; JSON-valued options (tenants,
subscriptions) accept a JSON string. cdk-nag's AwsSolutions checks always run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from async_inference.inbox import InboxRule
from async_inference.limits import RequestLimits
from cdk.ingestion_api import TenantPlan
from cdk.options import AsyncInferenceServiceProps, ModelSpec
from cdk.result_topics import TopicSubscription
from cdk.stack import AsyncInferenceStack

STACK_NAME_CONTEXT = "stack_name"


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{value!r} is not a boolean")


def _tenants(value: Any) -> dict[str, TenantPlan]:
    return {tenant: TenantPlan(**(plan or {})) for tenant, plan in _json(value).items()}


def _subscriptions(value: Any) -> tuple[TopicSubscription, ...]:
    return tuple(TopicSubscription(**entry) for entry in _json(value))


def _inbox_rules(value: Any) -> tuple[InboxRule, ...]:
    return tuple(InboxRule.model_validate(entry) for entry in _json(value))


def _models(value: Any) -> tuple[ModelSpec, ...]:
    return tuple(ModelSpec(**entry) for entry in _json(value))


def _optional_int(value: Any) -> int | None:
    return int(value) if value not in (None, "") else None


def _optional_float(value: Any) -> float | None:
    return float(value) if value not in (None, "") else None


def _optional_str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "tenants": _tenants,
    "request_limits": lambda v: RequestLimits.model_validate(_json(v)),
    "subscriptions": _subscriptions,
    "models": _models,
    "inbox_rules": _inbox_rules,
    "cors_allowed_origins": lambda v: tuple(_json(v)),
    "availability_zones": lambda v: tuple(_json(v)),
    "gpu_fallback_instance_types": lambda v: tuple(_json(v)),
    "worker_image_context": lambda v: Path(v).resolve(),
    "alarm_topic_arn": _optional_str,
    "alarm_email": _optional_str,
    "gpu_ami_parameter_name": _optional_str,
    "gpu_ami_id": _optional_str,
    "model_s3_uri": _optional_str,
    "hf_token_secret_arn": _optional_str,
    "tool_call_parser": _optional_str,
    "create_api_gateway_cloudwatch_role": _bool,
    "destroy_data_on_delete": _bool,
    "websocket_push": _bool,
    "wake_from_zero": _bool,
    "eventbridge_events": _bool,
    "fleet_stacks": _bool,
}
_BY_TYPE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "str": str,
    "float": float,
    "int | None": _optional_int,
    "float | None": _optional_float,
}
_NOT_FROM_CONTEXT = {"log_retention"}
# Options that no longer exist, and what replaced them: refused rather than silently ignored.
_RETIRED = {
    "scale_out_steps": "scale-out now follows the backlog: set jobs_per_task (cdk.queue_scaling.QueueScaling)",
    "event_rules": "the same rules are now inbox_rules (objects under inbox/ become jobs and batches): rename the key",
}


def props_from_context(app: App) -> AsyncInferenceServiceProps:
    """The service options set in context, converted and validated; unset ones keep their defaults."""
    for name, replacement in _RETIRED.items():
        if app.node.try_get_context(name) is not None:
            raise ValueError(f"context option {name} was removed: {replacement}")
    values: dict[str, Any] = {}
    for field in dataclasses.fields(AsyncInferenceServiceProps):
        raw = app.node.try_get_context(field.name)
        if raw is None or field.name in _NOT_FROM_CONTEXT:
            continue
        convert = _CONVERTERS.get(field.name) or _BY_TYPE[str(field.type)]
        try:
            values[field.name] = convert(raw)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"context option {field.name}: {exc}") from exc
    props = AsyncInferenceServiceProps(**values)
    props.validate()
    return props


def build(app: App) -> AsyncInferenceStack:
    """The stack for ``app`` with cdk-nag on; the account and region come from the CLI's environment, if any."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    env = None
    if os.environ.get("CDK_DEFAULT_REGION"):
        env = Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ["CDK_DEFAULT_REGION"])
    name = app.node.try_get_context(STACK_NAME_CONTEXT) or "AsyncInference"
    return AsyncInferenceStack(
        app, name, props=props_from_context(app), env=env, description="Asynchronous LLM inference service"
    )


def synth(app: App) -> None:
    """``app.synth()``; a stack over CloudFormation's 500 resources is refused with the option that moves the tenants'
    resources out of it (the CDK's own error names only the count)."""
    try:
        app.synth()
    except RuntimeError as exc:
        over = re.search(r"Number of resources in stack '([^']+)': (\d+) is greater", str(exc))
        if over is None or app.node.try_get_context("tenant_stacks"):
            raise
        raise ValueError(
            f"stack {over[1]} holds {over[2]} resources, over CloudFormation's 500: each tenant takes 9 of them; set "
            "tenant_stacks (e.g. -c tenant_stacks=4) to place the tenants' resources in nested stacks "
            '(docs/deploying.md, "Tenants")'
        ) from exc


if __name__ == "__main__":
    application = App()
    build(application)
    synth(application)
