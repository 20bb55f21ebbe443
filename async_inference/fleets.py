"""Which fleet serves a model: each model of the stack's ``models`` context has its own claim-check queue pair, batch
lane and worker service (cdk/model_fleet.py), and whatever queues a job or a batch's chunks routes it by the model
the request names.

The stack writes each model's route in the deployment's catalog (``async_inference.catalog``); every function that
queues work (the API, the upload handler, the batch controller, the inbox) reads them at start as one JSON object,
``MODEL_FLEETS`` (``async_inference.config``):
``{"<model>": {"kind": "chat", "queue_url": ..., "batch_queue_url": ..., "worker_service": ...}}``. The routes are
the only way to a queue: a model without one is not served. The route named ``ANY_MODEL`` (``"*"``) takes every model
the others do not name, of either kind: the local runtime sets it for its engines that answer any model name; the
stack never does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

ModelKind = Literal["chat", "embedding"]
CHAT: ModelKind = "chat"
EMBEDDING: ModelKind = "embedding"
MODEL_KINDS = (CHAT, EMBEDDING)
# What a request of each kind is sent to: the error for a model of the other kind names it.
KIND_ENDPOINTS: dict[str, str] = {CHAT: "/v1/chat/completions", EMBEDDING: "/v1/embeddings"}
# The route of every model no other route names (as "*" in SERVED_MODELS serves every name).
ANY_MODEL = "*"


class FleetRoute(BaseModel):
    """Where one model's work goes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ModelKind = CHAT
    queue_url: str  # the model's job queue
    batch_queue_url: str | None = None  # its batch lane (chunks, and jobs submitted with priority "batch")
    worker_service: str | None = None  # its ECS service's ARN, woken from zero
    worker_cluster: str | None = None  # the service's cluster when the fleet has its own (else WORKER_CLUSTER_NAME)
    worker_group: str | None = None  # its GPU Auto Scaling group, where a wake from zero starts an instance
    worker_max_tasks: int | None = None  # its service's scaling maximum, restored when a wake's hold ends
    worker_hold_max_tasks: int | None = None  # its service's maximum while a wake's hold lasts (None: not held)


def route_of(routes: Mapping[str, FleetRoute], model: str) -> FleetRoute | None:
    """``model``'s route, else the ``ANY_MODEL`` route, else None (no fleet serves it)."""
    return routes.get(model) or routes.get(ANY_MODEL)


def kind_of_endpoint(endpoint: str) -> str:
    """The model kind an endpoint runs (``/v1/embeddings``: embedding; everything else: chat)."""
    return EMBEDDING if endpoint.rstrip("/").endswith("/embeddings") else CHAT


def wrong_kind_message(model: str, kind: str, wanted: str) -> str:
    """What a request of kind ``wanted`` for a model of ``kind`` is told."""
    return (
        f"The model `{model}` is a{'n' if kind == EMBEDDING else ''} {kind} model and does not serve this endpoint; "
        f"send it to {KIND_ENDPOINTS.get(kind, kind)}, or name a {wanted} model (GET /v1/models lists them)"
    )
