"""The ASGI app the streaming API function runs under Lambda Web Adapter (``run.sh``): the Lambda proxy handler named
by the function's ``PROXY_HANDLER`` (the API's own, lambdas.api.handler), each answer's body sent as it comes
(``async_inference.streaming.asgi.proxy_app``). Locally the same handler runs in the local Lambda host, named by the
same variable (local_runtime/functions.py)."""

from __future__ import annotations

import importlib
import os

from async_inference.streaming.asgi import ENV_PROXY_HANDLER, proxy_app

_module, _, _name = os.environ[ENV_PROXY_HANDLER].rpartition(".")
app = proxy_app(getattr(importlib.import_module(_module), _name))
