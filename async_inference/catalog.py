"""The deployment's catalog: one SSM parameter per tenant and per model, which the stack writes and the functions read
at start, so that no Lambda environment grows with the number of tenants or models (Lambda's 4 KB quota).

The stack (``cdk.catalog.DeploymentCatalog``) writes, under its path ``CATALOG_PATH`` (``/<stack name>/catalog/``):

- ``tenants/<n>``: ``{"name": "<tenant>", "api_key_ids": [...], "quota": {...}, "webhook_secret_arn": "...",
  "webhook_queue_url": "..."}``;
- ``models/<n>``: ``{"name": "<model>", "route": {...}}``, the model's ``async_inference.fleets.FleetRoute``.

Each function gets only ``CATALOG_PATH`` and ``CATALOG_DIGEST``, a hash of what the stack wrote: a deploy that
changes the catalog changes the digest, so Lambda starts new execution environments, which read the new catalog. The
names are the stack's, not the tenant's or model's (a model name may hold characters a parameter name may not), and
only parameters under the stack's own path count: the functions trust only the tenants and key ids their stack
wrote (docs/security.md).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from typing import Any, Literal

ENV_CATALOG_PATH = "CATALOG_PATH"
ENV_CATALOG_DIGEST = "CATALOG_DIGEST"
Part = Literal["tenants", "models"]
TENANTS: Part = "tenants"
MODELS: Part = "models"


def part_path(root: str, part: Part) -> str:
    """The path under which ``part``'s parameters are (``root`` ends with ``/``)."""
    return f"{root}{part}"


def _parameters(ssm: Any, path: str) -> Iterator[dict[str, Any]]:
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=path, Recursive=True):
        yield from page["Parameters"]


def read_part(ssm: Any, root: str, part: Part) -> dict[str, dict[str, Any]]:
    """``part``'s entries under ``root``, by their name (the tenant or model), read with ``ssm`` (a boto3 client)."""
    entries: dict[str, dict[str, Any]] = {}
    for parameter in _parameters(ssm, part_path(root, part)):
        entry = json.loads(parameter["Value"])
        entries[entry.pop("name")] = entry
    return entries


def deployed_part(part: Part) -> dict[str, dict[str, Any]] | None:
    """``part`` of the catalog ``CATALOG_PATH`` names, read once per process and endpoint (None without
    ``CATALOG_PATH``)."""
    root = os.environ.get(ENV_CATALOG_PATH)
    if not root:
        return None
    return _deployed_part(root, os.environ.get("AWS_ENDPOINT_URL"), part)


@functools.cache
def _deployed_part(root: str, endpoint: str | None, part: Part) -> dict[str, dict[str, Any]]:
    # Keyed by the endpoint too: a test process may read two local stacks (two moto servers) of the same path.
    from async_inference.aws import client  # the adapters import the settings, which import this module

    return read_part(client("ssm"), root, part)
