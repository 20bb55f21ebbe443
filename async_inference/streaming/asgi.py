"""One streaming handler for both places it runs: an ASGI app over a Lambda proxy handler whose body may be an iterable.

A route that streams is written once, as a Lambda proxy handler that answers ``{"statusCode", "headers", "body"}``
with ``body`` an iterable of str or bytes (the frames of ``async_inference.streaming.sse``):

* locally, the gateway invokes it with a response stream (``local_runtime/lambda_host.py``'s ``/invoke-stream``)
  when the template's integration is ``STREAM`` (``local_runtime/rest_api.py``);
* on AWS, Lambda Web Adapter in ``response_stream`` mode runs ``proxy_app(handler)`` under an ASGI server and streams
  what it sends (docs/streaming.md, "Transport"). The adapter passes API Gateway's request as plain HTTP, with the
  request context (identity, the authorizer's context, the resource path) as JSON in ``x-amzn-request-context`` and
  the invocation's in ``x-amzn-lambda-context``; ``proxy_event`` makes the proxy event back from them.

Each piece of the body is sent as the handler yields it; the handler and its iterable run in a thread (they block on
the log's Queries), so the server's loop keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qs

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]
REQUEST_CONTEXT_HEADER = "x-amzn-request-context"
# A Web Adapter function's variable naming the proxy handler its ASGI app serves (module.function, as a Handler).
ENV_PROXY_HANDLER = "PROXY_HANDLER"
LAMBDA_CONTEXT_HEADER = "x-amzn-lambda-context"


class LambdaContext:
    """The Lambda context a handler reads, from the adapter's ``x-amzn-lambda-context`` (defaults without it)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.function_name = fields.get("function_name", "local")
        self.function_version = fields.get("function_version", "$LATEST")
        self.invoked_function_arn = fields.get("invoked_function_arn", "")
        self.memory_limit_in_mb = int(fields.get("memory_limit_in_mb", 128))
        self.aws_request_id = fields.get("request_id", "")
        self.log_group_name = fields.get("log_group_name", "")
        self.log_stream_name = fields.get("log_stream_name", "")
        self._deadline_ms = int(fields.get("deadline", 0)) or None

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self._deadline_ms - int(time.time() * 1000)) if self._deadline_ms else 900_000


def _path_parameters(template: str, path: str) -> dict[str, str] | None:
    """``{name}`` segments of the resource ``template`` read from ``path`` (``{name+}`` takes the rest)."""
    names, parts = [s for s in template.split("/") if s], [s for s in path.split("/") if s]
    found = {}
    for index, name in enumerate(names):
        if name.startswith("{") and name.endswith("+}"):
            found[name[1:-2]] = "/".join(parts[index:])
            return found
        if name.startswith("{") and name.endswith("}") and index < len(parts):
            found[name[1:-1]] = parts[index]
    return found or None


def proxy_event(scope: dict[str, Any], body: bytes) -> dict[str, Any]:
    """The API Gateway (REST) proxy event of an ASGI HTTP request as the adapter forwards it."""
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        headers[name.decode("latin-1")] = value.decode("latin-1")
    context = json.loads(headers.pop(REQUEST_CONTEXT_HEADER, "") or "{}")
    headers.pop(LAMBDA_CONTEXT_HEADER, None)
    query = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True)
    resource = context.get("resourcePath") or scope["path"]
    try:
        text, is_base64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, is_base64 = base64.b64encode(body).decode(), True
    return {
        "resource": resource,
        "path": scope["path"],
        "httpMethod": scope["method"],
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": _path_parameters(resource, scope["path"]),
        "stageVariables": None,
        "requestContext": context,
        "body": text if body else None,
        "isBase64Encoded": is_base64,
    }


def _pieces(body: Any) -> Iterator[bytes]:
    items: Iterable[Any] = [body] if isinstance(body, (str, bytes)) else body or []
    for item in items:
        data = item.encode() if isinstance(item, str) else item
        if data:
            yield data


def proxy_app(handler: Handler) -> ASGIApp:
    """An ASGI app that answers each HTTP request with ``handler``'s proxy response, its body's pieces sent as they
    come."""

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        lambda_context = dict(scope.get("headers", [])).get(LAMBDA_CONTEXT_HEADER.encode(), b"{}")
        context = LambdaContext(json.loads(lambda_context or b"{}"))
        response = await asyncio.to_thread(handler, proxy_event(scope, body), context)
        headers = [(str(k).lower().encode(), str(v).encode()) for k, v in (response.get("headers") or {}).items()]
        await send({"type": "http.response.start", "status": int(response.get("statusCode", 200)), "headers": headers})
        raw = response.get("body")
        if response.get("isBase64Encoded") and isinstance(raw, str):
            raw = base64.b64decode(raw)
        pieces, done = _pieces(raw), object()
        while (piece := await asyncio.to_thread(next, pieces, done)) is not done:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app
