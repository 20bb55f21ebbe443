"""A local stand-in for API Gateway: checks the API key as API Gateway would, turns each HTTP request into a REST API
proxy event and calls the same Lambda handler that is deployed."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from local_runtime.lambda_env import LocalLambdaContext

# API Gateway's own payload limit; the handler enforces the service's smaller one.
API_GATEWAY_MAX_BODY = 10 * 1024 * 1024
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


class ApiKeys:
    """API keys as API Gateway holds them (here: in moto's API Gateway), looked up by value."""

    def __init__(self, apigateway: Any) -> None:
        self._apigateway = apigateway
        self._by_value: dict[str, str] = {}
        self._lock = threading.Lock()

    def key_id(self, value: str) -> str | None:
        with self._lock:
            if value not in self._by_value:
                items = self._apigateway.get_api_keys(includeValues=True)["items"]
                self._by_value = {k["value"]: k["id"] for k in items if k.get("enabled", True)}
            return self._by_value.get(value)


def proxy_event(method: str, target: str, headers: dict[str, str], body: bytes, *, api_key: str, api_key_id: str,
                source_ip: str) -> dict[str, Any]:
    split = urlsplit(target)
    query = parse_qs(split.query, keep_blank_values=True)
    try:
        text, is_base64 = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, is_base64 = base64.b64encode(body).decode(), True
    return {
        "resource": "/{proxy+}",
        "path": split.path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": {"proxy": split.path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/local{split.path}",
            "stage": "local",
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": int(time.time() * 1000),
            "accountId": "123456789012",
            "apiId": "local",
            "protocol": "HTTP/1.1",
            "identity": {"sourceIp": source_ip, "apiKey": api_key, "apiKeyId": api_key_id, "userAgent": headers.get("User-Agent")},
        },
        "body": text if body else None,
        "isBase64Encoded": is_base64,
    }


def make_server(host: str, port: int, handler: Handler, api_keys: ApiKeys) -> ThreadingHTTPServer:
    # A Lambda execution environment handles one event at a time, and the handler relies on that: the Powertools
    # resolver keeps the current event on the module-level app. Connections are served concurrently; invocations
    # are not.
    one_invocation_at_a_time = threading.Lock()

    class Gateway(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _gateway_error(self, status: int, message: str) -> None:
            body = json.dumps({"message": message}).encode()
            self._reply(status, body, {"Content-Type": "application/json"})

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > API_GATEWAY_MAX_BODY:
                self.close_connection = True
                return self._gateway_error(413, "Request Too Long")
            body = self.rfile.read(length) if length else b""
            key = self.headers.get("x-api-key")
            if not key:
                return self._gateway_error(401, "Missing API key: send it in the x-api-key header")
            key_id = api_keys.key_id(key)
            if key_id is None:
                return self._gateway_error(403, "Forbidden: unknown API key")
            event = proxy_event(self.command, self.path, dict(self.headers.items()), body, api_key=key,
                                api_key_id=key_id, source_ip=self.client_address[0])
            with one_invocation_at_a_time:
                response = handler(event, LocalLambdaContext(function_name="api"))
            payload = response.get("body") or ""
            raw = base64.b64decode(payload) if response.get("isBase64Encoded") else payload.encode()
            headers = dict(response.get("headers") or {})
            for name, values in (response.get("multiValueHeaders") or {}).items():
                headers[name] = ", ".join(values)
            headers["x-amzn-RequestId"] = event["requestContext"]["requestId"]
            self._reply(int(response["statusCode"]), raw, headers)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

    server = ThreadingHTTPServer((host, port), Gateway)
    server.daemon_threads = True
    return server
