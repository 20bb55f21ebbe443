"""One proxy handler streams under an ASGI server as Lambda Web Adapter runs it: the proxy event rebuilt from the
adapter's request, and each piece of the body sent as the handler yields it."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from async_inference.streaming.asgi import REQUEST_CONTEXT_HEADER, proxy_app


def scope(path: str, query: bytes = b"", context: dict[str, Any] | None = None) -> dict[str, Any]:
    headers = [(b"accept", b"text/event-stream")]
    if context is not None:
        headers.append((REQUEST_CONTEXT_HEADER.encode(), json.dumps(context).encode()))
    return {"type": "http", "method": "POST", "path": path, "query_string": query, "headers": headers}


async def call(app, request_scope: dict[str, Any], body: bytes, on_message=None) -> list[dict[str, Any]]:
    """Drive the app as an ASGI server does; the messages it sent."""
    sent: list[dict[str, Any]] = []
    requests = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return requests.pop(0) if requests else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if on_message is not None:
            on_message(message)

    await app(request_scope, receive, send)
    return sent


def test_the_handler_gets_the_proxy_event_of_the_adapters_request():
    seen = {}

    def handler(event, context):
        seen.update(event)
        return {"statusCode": 200, "body": "ok"}

    context = {"resourcePath": "/v1/responses/{response_id}", "authorizer": {"tenant": "demo"}}
    asyncio.run(
        call(proxy_app(handler), scope("/v1/responses/resp_1", b"stream=true&starting_after=4", context), b"{}")
    )
    assert seen["resource"] == "/v1/responses/{response_id}" and seen["pathParameters"] == {"response_id": "resp_1"}
    assert seen["queryStringParameters"] == {"stream": "true", "starting_after": "4"}
    assert seen["requestContext"]["authorizer"] == {"tenant": "demo"} and seen["body"] == "{}"
    assert REQUEST_CONTEXT_HEADER not in seen["headers"]


def test_each_piece_is_sent_before_the_handler_yields_the_next():
    # GIVEN a handler whose second piece waits until the first has been sent
    first_sent = threading.Event()

    def pieces():
        yield "data: 1\n\n"
        assert first_sent.wait(5), "the second piece was asked for before the first was sent"
        yield "data: 2\n\n"

    def handler(event, context):
        return {"statusCode": 201, "headers": {"Content-Type": "text/event-stream"}, "body": pieces()}

    def on_message(message):
        if message.get("body") == b"data: 1\n\n":
            first_sent.set()

    # WHEN an ASGI server runs it
    sent = asyncio.run(call(proxy_app(handler), scope("/v1/chat/completions"), b"{}", on_message))
    # THEN the status and headers came first, then each piece on its own, then the end
    assert sent[0] == {
        "type": "http.response.start",
        "status": 201,
        "headers": [(b"content-type", b"text/event-stream")],
    }
    assert [m["body"] for m in sent[1:]] == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m["more_body"] for m in sent[1:]] == [True, True, False]
