"""The SDK and command line of the asynchronous inference service's HTTP API (v1): ``pip install`` this package alone
(no AWS SDK, nothing of the service). ``Client`` blocks, ``AsyncClient`` awaits; both run one implementation.

The service imports this package's wire models (``async_inference_client.models``, ``limits``) with pydantic alone,
without the HTTP and WebSocket libraries its functions do not bundle: so the clients below are imported on first use,
not with the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from async_inference_client._base_client import ENV_API_KEY, ENV_API_URL, ENV_WS_URL
    from async_inference_client.client import AsyncClient, Client
    from async_inference_client.errors import (
        ApiError,
        ApiUnreachable,
        AsyncInferenceError,
        BatchWaitTimeout,
        NoResult,
        SubscriptionRefused,
        UnexpectedResponse,
        WaitTimeout,
    )
    from async_inference_client.retry import DEFAULT_POLL, Backoff, RetryPolicy
    from async_inference_client.types import JobUpdate, OnUpdate

# Each public name and the module that defines it.
_EXPORTS = {
    "async_inference_client._base_client": ("ENV_API_KEY", "ENV_API_URL", "ENV_WS_URL"),
    "async_inference_client.types": ("JobUpdate", "OnUpdate"),
    "async_inference_client.client": ("AsyncClient", "Client"),
    "async_inference_client.errors": (
        "ApiError",
        "ApiUnreachable",
        "AsyncInferenceError",
        "BatchWaitTimeout",
        "NoResult",
        "SubscriptionRefused",
        "UnexpectedResponse",
        "WaitTimeout",
    ),
    "async_inference_client.retry": ("DEFAULT_POLL", "Backoff", "RetryPolicy"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [
    "DEFAULT_POLL",
    "ENV_API_KEY",
    "ENV_API_URL",
    "ENV_WS_URL",
    "ApiError",
    "ApiUnreachable",
    "AsyncClient",
    "AsyncInferenceError",
    "Backoff",
    "BatchWaitTimeout",
    "Client",
    "JobUpdate",
    "NoResult",
    "OnUpdate",
    "RetryPolicy",
    "SubscriptionRefused",
    "UnexpectedResponse",
    "WaitTimeout",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
