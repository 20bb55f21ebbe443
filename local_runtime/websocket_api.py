"""The template's WebSocket API on 127.0.0.1, as API Gateway serves it: routes read from the template invoke their
functions with the events API Gateway sends, and the management API that backends post to connections through.

What API Gateway does, and what this does with it (``websockets`` serves the connections):

* the handshake, on ``/{stage}``: the ``$connect`` route's function gets a ``CONNECT`` event (``headers``,
  ``queryStringParameters``, ``requestContext`` with ``connectionId``, ``routeKey``, ``eventType``, ``domainName``,
  ``stage``, ``apiId``, ``identity``); a status other than 2xx refuses the handshake with that status, a function
  error with 500. Another path is a 404 (API Gateway serves stages only);
* each message: the API's ``RouteSelectionExpression`` (``$request.body.<field>``) picks the route, ``$default``
  when the message is not JSON or names no route; the function gets a ``MESSAGE`` event with the ``body``; a route
  with a route response sends the function's ``body`` back on the connection. No route (and no ``$default``), or a
  function error, sends API Gateway's own ``{"message": ..., "connectionId", "requestId"}``;
* the close, by either side: the ``$disconnect`` route's function gets a ``DISCONNECT`` event;
* the management API (``apigatewaymanagementapi``) on its own port, at ``/{stage}/@connections/{id}``: ``POST``
  sends the body to the connection, ``GET`` describes it, ``DELETE`` closes it; a connection that is not open is
  ``410 GoneException``, as API Gateway answers. Requests are not signature-checked (moto's credentials).

Not emulated: the 10-minute idle timeout and the 2-hour connection limit (connections stay open until a side closes
them), stage throttling (checked on the template), authorizers and API-key-required routes (refused: the template has
none), and integrations other than Lambda proxy (refused by name).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import datetime as dt
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from local_runtime.deployer import Deployment
from local_runtime.functions import InvokeResult, LocalFunction
from local_runtime.rest_api import _FUNCTION_ARN
from local_runtime.template import LOCAL_ACCOUNT, TemplateError

logger = logging.getLogger("local_runtime.websocket_api")
_GONE = {"message": None}
POST_TIMEOUT_S = 10.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _request_time(epoch_ms: int) -> str:
    """API Gateway's ``requestTime``: 01/Dec/2026:11:38:14 +0000."""
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")


def new_connection_id() -> str:
    """An id shaped like API Gateway's (``L0SM9cOFvHcCIhw=``): base64 of 10 random bytes."""
    return base64.b64encode(os.urandom(10)).decode()


@dataclass
class _Open:
    """An open connection and what its events repeat."""

    connection: ServerConnection
    connection_id: str
    connected_at: int
    source_ip: str
    user_agent: str | None
    last_active_at: int = field(default_factory=_now_ms)


class WebSocketApi:
    """One ``AWS::ApiGatewayV2::Api`` of the deployment (protocol WEBSOCKET), its routes integrated with local
    functions: ``start`` serves the connections on ``port`` and the management API on ``management_port``."""

    def __init__(
        self,
        deployment: Deployment,
        api_logical_id: str,
        functions: dict[str, LocalFunction],
        *,
        host: str,
        port: int,
        management_port: int,
    ) -> None:
        api = deployment.resources[api_logical_id]
        props = api.properties
        if props.get("ProtocolType") != "WEBSOCKET":
            raise TemplateError(f"{api_logical_id}: only WEBSOCKET APIs are served by local_runtime.websocket_api")
        self.api_id: str = api.ref
        self.host, self.port, self.management_port = host, port, management_port
        self.route_selection = props.get("RouteSelectionExpression", "$request.body.action")
        if not self.route_selection.startswith("$request.body."):
            raise TemplateError(
                f"{api_logical_id}: route selection {self.route_selection!r} does not run locally "
                "(only $request.body.<field>)"
            )
        integrations = {
            p.ref: p.properties
            for p in deployment.of_type("AWS::ApiGatewayV2::Integration").values()
            if p.properties.get("ApiId") == self.api_id
        }
        self.routes: dict[str, LocalFunction] = {}
        self.route_ids: dict[str, str] = {}
        for physical in deployment.of_type("AWS::ApiGatewayV2::Route").values():
            route = physical.properties
            if route.get("ApiId") != self.api_id:
                continue
            key = route["RouteKey"]
            if route.get("AuthorizationType", "NONE") != "NONE" or route.get("ApiKeyRequired"):
                raise TemplateError(f"route {key}: authorizers and API-key-required routes do not run locally")
            integration = integrations[route["Target"].removeprefix("integrations/")]
            if integration.get("IntegrationType") != "AWS_PROXY":
                raise TemplateError(f"route {key}: only Lambda proxy integrations run locally")
            arn = _FUNCTION_ARN.search(integration["IntegrationUri"])["arn"]  # type: ignore[index]
            self.routes[key] = functions[deployment.function_by_arn(arn)]
            self.route_ids[physical.ref] = key
        self.responding = {
            self.route_ids[p.properties["RouteId"]]
            for p in deployment.of_type("AWS::ApiGatewayV2::RouteResponse").values()
            if p.properties.get("RouteId") in self.route_ids
        }
        stages = [
            p.ref
            for p in deployment.of_type("AWS::ApiGatewayV2::Stage").values()
            if p.properties.get("ApiId") == self.api_id
        ]
        if len(stages) != 1:
            raise TemplateError(f"{api_logical_id}: the local runtime serves one stage; the template has {len(stages)}")
        self.stage = stages[0]
        self.domain_name = f"{host}:{port}"
        self._open: dict[str, _Open] = {}
        self._ids: dict[uuid.UUID, tuple[str, int]] = {}  # handshake -> (connection id, connected at)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._management: ThreadingHTTPServer | None = None
        self._invocations = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ws-invoke")

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/{self.stage}"

    @property
    def management_url(self) -> str:
        """The stage's callback URL here: what ``https://{api}.execute-api.{region}.amazonaws.com/{stage}`` is in AWS."""
        return f"http://{self.host}:{self.management_port}/{self.stage}"

    # --- start and stop ---------------------------------------------------------------------------------------------

    def start(self) -> WebSocketApi:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(self._serve())
            except BaseException as exc:  # e.g. the port is taken: start() raises it
                failed.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="websocket-api", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        self._management = _management_server(self, self.host, self.management_port)
        threading.Thread(target=self._management.serve_forever, name="websocket-management", daemon=True).start()
        return self

    async def _serve(self) -> Server:
        # API Gateway answers pings itself; the client's keepalive pings are answered here too.
        return await serve(self._handle, self.host, self.port, process_request=self._connect, ping_interval=None)

    def stop(self) -> None:
        if self._management is not None:
            self._management.shutdown()
            self._management.server_close()
        if self._loop is not None and self._server is not None:

            async def close() -> None:
                assert self._server is not None
                self._server.close()
                await self._server.wait_closed()

            try:
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
            except (concurrent.futures.TimeoutError, RuntimeError):
                logger.warning("the WebSocket server did not close within 10 s")
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._invocations.shutdown(wait=False, cancel_futures=True)

    # --- the routes -------------------------------------------------------------------------------------------------

    async def _invoke(self, route_key: str, event: dict[str, Any]) -> InvokeResult | None:
        function = self.routes.get(route_key)
        if function is None:
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._invocations, function.invoke, event)

    def _context(
        self,
        connection_id: str,
        connected_at: int,
        route_key: str,
        event_type: str,
        *,
        source_ip: str,
        user_agent: str | None,
        **extra: Any,
    ) -> dict[str, Any]:
        now = _now_ms()
        request_id = base64.b64encode(os.urandom(6)).decode()
        return {
            "routeKey": route_key,
            "eventType": event_type,
            "extendedRequestId": request_id,
            "requestTime": _request_time(now),
            "messageDirection": "IN",
            "stage": self.stage,
            "connectedAt": connected_at,
            "requestTimeEpoch": now,
            "identity": {"sourceIp": source_ip, "userAgent": user_agent},
            "requestId": request_id,
            "domainName": self.domain_name,
            "connectionId": connection_id,
            "apiId": self.api_id,
            "accountId": LOCAL_ACCOUNT,
            **extra,
        }

    async def _connect(self, connection: ServerConnection, request: Request) -> Response | None:
        """The handshake: refused unless ``$connect`` (when the API has one) answers 2xx."""
        split = urlsplit(request.path)
        if split.path.rstrip("/") != f"/{self.stage}":
            return connection.respond(404, f"no stage at {split.path}: connect to /{self.stage}\n")
        connection_id, connected_at = new_connection_id(), _now_ms()
        headers = {name: value for name, value in request.headers.raw_items()}
        query = parse_qs(split.query, keep_blank_values=True)
        event = {
            "headers": headers,
            "multiValueHeaders": {name: request.headers.get_all(name) for name in headers},
            "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
            "multiValueQueryStringParameters": query or None,
            "requestContext": self._context(
                connection_id,
                connected_at,
                "$connect",
                "CONNECT",
                source_ip=connection.remote_address[0],
                user_agent=headers.get("User-Agent"),
            ),
            "isBase64Encoded": False,
        }
        result = await self._invoke("$connect", event)
        if result is not None:
            status = (
                500
                if result.error or not isinstance(result.payload, dict)
                else int(result.payload.get("statusCode", 200))
            )
            if not 200 <= status < 300:
                return connection.respond(status, "Internal server error\n" if status == 500 else "Forbidden\n")
        self._ids[connection.id] = (connection_id, connected_at)
        return None

    async def _handle(self, connection: ServerConnection) -> None:
        connection_id, connected_at = self._ids.pop(connection.id)
        request = connection.request
        opened = _Open(
            connection,
            connection_id,
            connected_at,
            source_ip=connection.remote_address[0],
            user_agent=request.headers.get("User-Agent") if request else None,
        )
        self._open[connection_id] = opened
        try:
            async for message in connection:
                opened.last_active_at = _now_ms()
                await self._message(opened, message if isinstance(message, str) else message.decode("utf-8", "replace"))
        except ConnectionClosed:
            pass
        finally:
            self._open.pop(connection_id, None)
            event = {
                "headers": {},
                "requestContext": self._context(
                    connection_id,
                    connected_at,
                    "$disconnect",
                    "DISCONNECT",
                    source_ip=opened.source_ip,
                    user_agent=opened.user_agent,
                    disconnectStatusCode=connection.close_code or 1006,
                    disconnectReason=connection.close_reason or "",
                ),
                "isBase64Encoded": False,
            }
            await self._invoke("$disconnect", event)

    def select_route(self, body: str) -> str:
        """The route key of a message: the value of the selection expression's field, or ``$default``."""
        try:
            document = json.loads(body)
        except ValueError:
            return "$default"
        for part in self.route_selection.removeprefix("$request.body.").split("."):
            document = document.get(part) if isinstance(document, dict) else None
        return document if isinstance(document, str) and document in self.routes else "$default"

    async def _message(self, opened: _Open, body: str) -> None:
        route_key = self.select_route(body)
        context = self._context(
            opened.connection_id,
            opened.connected_at,
            route_key,
            "MESSAGE",
            source_ip=opened.source_ip,
            user_agent=opened.user_agent,
            messageId=base64.b64encode(os.urandom(6)).decode(),
        )
        event = {"requestContext": context, "body": body, "isBase64Encoded": False}
        result = await self._invoke(route_key, event)
        if result is None or result.error:
            message = "Forbidden" if result is None else "Internal server error"
            await opened.connection.send(
                json.dumps(
                    {"message": message, "connectionId": opened.connection_id, "requestId": context["requestId"]}
                )
            )
            return
        if route_key in self.responding and isinstance(result.payload, dict) and result.payload.get("body"):
            await opened.connection.send(str(result.payload["body"]))

    # --- the management API -----------------------------------------------------------------------------------------

    def post(self, connection_id: str, data: bytes) -> bool:
        """Send ``data`` to the connection (text when it is UTF-8, as API Gateway sends it); False when it is gone."""
        opened = self._open.get(connection_id)
        if opened is None or self._loop is None:
            return False
        try:
            message: str | bytes = data.decode("utf-8")
        except UnicodeDecodeError:
            message = data
        try:
            asyncio.run_coroutine_threadsafe(opened.connection.send(message), self._loop).result(POST_TIMEOUT_S)
        except ConnectionClosed:
            return False
        return True

    def describe(self, connection_id: str) -> dict[str, Any] | None:
        opened = self._open.get(connection_id)
        if opened is None:
            return None
        iso = lambda ms: dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()  # noqa: E731
        return {
            "connectedAt": iso(opened.connected_at),
            "lastActiveAt": iso(opened.last_active_at),
            "identity": {"sourceIp": opened.source_ip, "userAgent": opened.user_agent},
        }

    def close(self, connection_id: str) -> bool:
        opened = self._open.get(connection_id)
        if opened is None or self._loop is None:
            return False
        asyncio.run_coroutine_threadsafe(opened.connection.close(), self._loop).result(POST_TIMEOUT_S)
        return True


def _management_server(api: WebSocketApi, host: str, port: int) -> ThreadingHTTPServer:
    """``POST|GET|DELETE /{stage}/@connections/{id}``, as ``apigatewaymanagementapi`` calls them."""

    class Management(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _connection_id(self) -> str | None:
            path = urlsplit(self.path).path
            prefix = f"/{api.stage}/@connections/"
            return unquote(path[len(prefix) :]) if path.startswith(prefix) and len(path) > len(prefix) else None

        def _answer(self, status: int, body: Any = None, error_type: str | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
            if error_type:
                self.send_header("x-amzn-ErrorType", error_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> str | None:
            connection_id = self._connection_id()
            if connection_id is None:
                self._answer(
                    404, {"message": f"no route: use /{api.stage}/@connections/{{connectionId}}"}, "NotFoundException"
                )
            return connection_id

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else b""
            connection_id = self._route()
            if connection_id is None:
                return
            if api.post(connection_id, data):
                self._answer(200)
            else:
                self._answer(410, _GONE, "GoneException")

        def do_GET(self) -> None:  # noqa: N802
            connection_id = self._route()
            if connection_id is None:
                return
            described = api.describe(connection_id)
            if described is None:
                self._answer(410, _GONE, "GoneException")
            else:
                self._answer(200, described)

        def do_DELETE(self) -> None:  # noqa: N802
            connection_id = self._route()
            if connection_id is None:
                return
            if api.close(connection_id):
                self._answer(204)
            else:
                self._answer(410, _GONE, "GoneException")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

    server = ThreadingHTTPServer((host, port), Management)
    server.daemon_threads = True
    return server
