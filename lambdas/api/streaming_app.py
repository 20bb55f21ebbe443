"""The ASGI app the streaming API function runs under Lambda Web Adapter (``run.sh``): the Lambda proxy handler named
by the function's ``PROXY_HANDLER`` (the API's own, lambdas.api.handler), each answer's body sent as it comes
(``async_inference.streaming.asgi.proxy_app``). Locally the same handler runs in the local Lambda host, named by the
same variable (local_runtime/functions.py)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from async_inference.streaming.asgi import ENV_PROXY_HANDLER, proxy_app

TRACE_HEADER = "x-amzn-trace-id"
TRACE_VARIABLE = "_X_AMZN_TRACE_ID"

_module, _, _name = os.environ[ENV_PROXY_HANDLER].rpartition(".")
_handler = getattr(importlib.import_module(_module), _name)


def traced(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The handler, with the invocation's X-Ray trace id where the X-Ray SDK reads it in Lambda: the runtime sets
    ``_X_AMZN_TRACE_ID`` per invocation for a handler it calls, and the adapter passes it as a header instead (one
    invocation at a time per execution environment, so the process-wide variable is this request's)."""
    trace = (event.get("headers") or {}).get(TRACE_HEADER)
    if trace:
        os.environ[TRACE_VARIABLE] = trace
    return dict(_handler(event, context))


app = proxy_app(traced)
