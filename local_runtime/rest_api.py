"""The template's REST API on 127.0.0.1, as API Gateway serves it: routes, API keys, request validation and gateway
responses all read from the template, each request handed to the integrated function as a Lambda proxy event.

What API Gateway does before a request reaches the function, and what this does with it:

* the route: an ``AWS::ApiGateway::Resource`` path and ``AWS::ApiGateway::Method``; none matches ->
  ``MISSING_AUTHENTICATION_TOKEN`` (403, as API Gateway answers unknown paths);
* the authorizer (``AuthorizationType`` CUSTOM, ``AuthorizerId``): a REQUEST authorizer of the template, run as
  ``local_runtime.authorizers`` says (identity sources, TTL cache, policy, context, ``usageIdentifierKey``) ->
  ``UNAUTHORIZED`` (401), ``ACCESS_DENIED`` (403), ``AUTHORIZER_FAILURE`` (500);
* the API key (``ApiKeyRequired``): the ``x-api-key`` header, or with the API's ``ApiKeySourceType`` AUTHORIZER the
  authorizer's ``usageIdentifierKey``, must be an enabled key of a usage plan of this API, as moto's API Gateway
  holds them -> ``INVALID_API_KEY`` (403). Throttling and quotas are not applied locally (the usage plans' limits are
  checked on the template);
* binary media types (``BinaryMediaTypes``, ``~1`` for ``/`` as CloudFormation writes them): a body whose
  Content-Type matches one reaches the function base64-encoded, as API Gateway's proxy integration sends it;
* the request validator: required parameters (``BAD_REQUEST_PARAMETERS``); the payload limit, 10 MB
  (``REQUEST_TOO_LARGE``);
* the function's answer: a proxy response is passed back; a function error is a 502 (``DEFAULT_5XX``);
* the integration's ``ResponseTransferMode``: ``STREAM`` invokes the function with a response stream
  (InvokeWithResponseStream, the ``/response-streaming-invocations`` URI) and sends the client the status and headers
  of the stream's metadata (the JSON before eight NUL bytes), then each piece of the body as it arrives (chunked
  transfer encoding), as API Gateway's REST response streaming does; ``BUFFERED`` (the default) waits for the whole
  response. A stream without its metadata is a 502 (``INTEGRATION_FAILURE``).

Every gateway-generated error is rendered from the template's ``AWS::ApiGateway::GatewayResponse`` for its type
(falling back to ``DEFAULT_4XX``/``DEFAULT_5XX``, then to API Gateway's own ``{"message": ...}``).

Not emulated, and refused by name when a template asks for it (``unsupported``): ``ANY`` methods and request body
validation against models. The app's template uses neither (its handlers validate bodies with pydantic and answer
with the API's own error envelope); a template that does is refused rather than served differently from AWS.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from local_runtime.authorizers import AuthorizerRefused, Request, RequestAuthorizer
from local_runtime.deployer import Deployment
from local_runtime.functions import LocalFunction
from local_runtime.template import LOCAL_ACCOUNT, LOCAL_REGION, TemplateError

MAX_PAYLOAD_BYTES = 10 * 1024 * 1024  # API Gateway's own limit
# Default status and message of the gateway responses this emulates (API Gateway's documented defaults).
_DEFAULTS = {
    "MISSING_AUTHENTICATION_TOKEN": (403, "Missing Authentication Token"),
    "INVALID_API_KEY": (403, "Forbidden"),
    "BAD_REQUEST_BODY": (400, "Invalid request body"),
    "BAD_REQUEST_PARAMETERS": (400, "Missing required request parameters"),
    "REQUEST_TOO_LARGE": (413, "Request Too Long"),
    "INTEGRATION_FAILURE": (502, "Internal server error"),
    "UNAUTHORIZED": (401, "Unauthorized"),
    "ACCESS_DENIED": (403, "User is not authorized to access this resource"),
    "AUTHORIZER_FAILURE": (500, "Internal server error"),
    "AUTHORIZER_CONFIGURATION_ERROR": (500, "Internal server error"),
    # Not raised here (usage plans are not enforced locally); rendered from the template like the others.
    "THROTTLED": (429, "Too Many Requests"),
    "QUOTA_EXCEEDED": (429, "Limit Exceeded"),
}
_FUNCTION_ARN = re.compile(r"functions/(?P<arn>.+)/(?:response-streaming-)?invocations$")
_STREAM_DELIMITER = b"\0" * 8  # between a streamed response's metadata and its body
Body = bytes | Iterator[bytes]


def unsupported(method: dict[str, Any], validator: dict[str, Any]) -> str | None:
    """What the local gateway cannot serve as API Gateway would in an ``AWS::ApiGateway::Method``'s properties (with
    its request validator's), or None."""
    if method.get("HttpMethod") == "ANY":
        return "an ANY method (the local gateway routes each HTTP method the template names)"
    if validator.get("ValidateRequestBody") and method.get("RequestModels"):
        return "request body validation against a model (the local gateway validates parameters only)"
    return None


@dataclass
class Method:
    resource_path: str  # e.g. /v1/jobs/{job_id}
    http_method: str
    function: LocalFunction
    api_key_required: bool
    streams: bool = False  # the integration's ResponseTransferMode is STREAM
    required_parameters: list[str] = field(default_factory=list)  # method.request.header.x ...
    authorizer: RequestAuthorizer | None = None

    @property
    def _segments(self) -> list[str]:
        return [s for s in self.resource_path.split("/") if s]

    def match(self, path: str) -> dict[str, str] | None:
        """Path parameters when ``path`` matches this method's resource path."""
        parts, params = [s for s in path.split("/") if s], {}
        segments = self._segments
        for index, segment in enumerate(segments):
            if segment.startswith("{") and segment.endswith("+}"):
                params[segment[1:-2]] = "/".join(parts[index:])
                return params if index < len(parts) else None
            if index >= len(parts):
                return None
            if segment.startswith("{") and segment.endswith("}"):
                params[segment[1:-1]] = parts[index]
            elif segment != parts[index]:
                return None
        return params if len(parts) == len(segments) else None

    @property
    def specificity(self) -> tuple[int, int]:
        literal = sum(1 for s in self._segments if not s.startswith("{"))
        return literal, len(self._segments)


@dataclass
class GatewayError(Exception):
    response_type: str
    message: str | None = None
    validation_errors: str = ""


class RestApi:
    """One ``AWS::ApiGateway::RestApi`` of the deployment, its methods integrated with local functions."""

    def __init__(self, deployment: Deployment, api_logical_id: str, functions: dict[str, LocalFunction]) -> None:
        self._deployment = deployment
        api = deployment.resources[api_logical_id]
        self.api_id: str = api.ref
        api_properties = deployment.assembly.resources[api_logical_id]["Properties"]
        self.key_source = api_properties.get("ApiKeySourceType", "HEADER")
        self.binary_media_types = [t.replace("~1", "/").lower() for t in api.properties.get("BinaryMediaTypes", [])]
        authorizers = {}
        for logical_id, physical in deployment.of_type("AWS::ApiGateway::Authorizer").items():
            if physical.properties["RestApiId"] == self.api_id:
                uri = _FUNCTION_ARN.search(physical.properties["AuthorizerUri"])["arn"]  # type: ignore[index]
                authorizers[physical.ref] = RequestAuthorizer(
                    logical_id, physical.properties, functions[deployment.function_by_arn(uri)]
                )
        paths = {api.attributes["RootResourceId"]: ""}
        resources = {
            lid: p
            for lid, p in deployment.of_type("AWS::ApiGateway::Resource").items()
            if p.properties["RestApiId"] == self.api_id
        }
        while len(paths) <= len(resources):  # parents before children
            for physical in resources.values():
                parent = physical.properties["ParentId"]
                if parent in paths and physical.ref not in paths:
                    paths[physical.ref] = f"{paths[parent]}/{physical.properties['PathPart']}"
        validators = {p.ref: p.properties for p in deployment.of_type("AWS::ApiGateway::RequestValidator").values()}
        self.methods: list[Method] = []
        for physical in deployment.of_type("AWS::ApiGateway::Method").values():
            props = physical.properties
            if props["RestApiId"] != self.api_id or props.get("HttpMethod") == "OPTIONS":
                continue
            integration = props.get("Integration", {})
            if integration.get("Type") != "AWS_PROXY":
                raise ValueError(f"{physical.logical_id}: only Lambda proxy integrations run locally")
            arn = _FUNCTION_ARN.search(integration["Uri"])["arn"]  # type: ignore[index]
            validator = validators.get(props.get("RequestValidatorId"), {})
            reason = unsupported(props, validator)
            if reason:
                raise TemplateError(f"{physical.logical_id}: {reason} does not run locally")
            method = Method(
                resource_path=paths[props["ResourceId"]] or "/",
                http_method=props["HttpMethod"],
                function=functions[deployment.function_by_arn(arn)],
                api_key_required=bool(props.get("ApiKeyRequired")),
                streams=integration.get("ResponseTransferMode", "BUFFERED") == "STREAM",
                authorizer=authorizers[props["AuthorizerId"]] if props.get("AuthorizationType") == "CUSTOM" else None,
            )
            if validator.get("ValidateRequestParameters"):
                method.required_parameters = [
                    k for k, required in props.get("RequestParameters", {}).items() if required
                ]
            self.methods.append(method)
        self.stage = next(
            (
                p.ref
                for p in deployment.of_type("AWS::ApiGateway::Stage").values()
                if p.properties.get("RestApiId") == self.api_id
            ),
            "prod",
        )
        self.gateway_responses = {
            p.properties["ResponseType"]: p.properties
            for p in deployment.of_type("AWS::ApiGateway::GatewayResponse").values()
            if p.properties.get("RestApiId") == self.api_id
        }
        self._keys = _ApiKeys(deployment.client("apigateway"), self.api_id)

    # --- a request --------------------------------------------------------------------------------------------------

    def route(self, http_method: str, path: str) -> tuple[Method, dict[str, str]]:
        candidates = []
        for method in self.methods:
            params = method.match(path)
            if params is not None and method.http_method == http_method:
                candidates.append((method.specificity, method, params))
        if not candidates:
            raise GatewayError("MISSING_AUTHENTICATION_TOKEN")
        _, method, params = max(candidates, key=lambda c: c[0])
        return method, params

    def handle(
        self,
        http_method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        source_ip: str,
        multi_value_headers: dict[str, list[str]] | None = None,
    ) -> tuple[int, dict[str, str], Body]:
        """The answer to one request: its status, headers and body (the body's pieces as they come, for a method
        whose integration streams). ``headers``: each header's last value, as API Gateway's proxy and authorizer
        events carry them; ``multi_value_headers``: every value of each (None: one each, ``headers``'s)."""
        request_id = str(uuid.uuid4())
        multi = multi_value_headers or {k: [v] for k, v in headers.items()}
        try:
            split = urlsplit(target)
            method, path_params = self.route(http_method, split.path)
            lowered = {k.lower(): v for k, v in headers.items()}
            identity: dict[str, Any] = {"sourceIp": source_ip, "userAgent": lowered.get("user-agent")}
            query = parse_qs(split.query, keep_blank_values=True)
            authorizer: dict[str, Any] | None = None
            usage_key: str | None = None
            if method.authorizer is not None:
                authorized = self._authorize(
                    method, split.path, path_params, query, headers, multi, identity, request_id
                )
                authorizer = {**authorized.context, "principalId": authorized.principal_id}
                usage_key = authorized.usage_identifier_key
            if method.api_key_required:
                key = lowered.get("x-api-key") if self.key_source == "HEADER" else usage_key
                key_id = self._keys.key_id(key) if key else None
                if key_id is None:
                    raise GatewayError("INVALID_API_KEY")
                identity.update(apiKey=key, apiKeyId=key_id)
            self._validate(method, lowered, query)
            event = self._proxy_event(method, split.path, path_params, query, headers, body, identity, request_id)
            event["multiValueHeaders"] = multi
            if authorizer is not None:
                event["requestContext"]["authorizer"] = authorizer
            if method.streams:
                streamed = method.function.invoke_stream(event)
                if streamed.error is not None:
                    raise GatewayError("INTEGRATION_FAILURE")
                return self._streamed_response(streamed.chunks, request_id)
            result = method.function.invoke(event)
            if result.error or not isinstance(result.payload, dict) or "statusCode" not in result.payload:
                raise GatewayError("INTEGRATION_FAILURE")
            return self._proxy_response(result.payload, request_id)
        except GatewayError as error:
            return self._gateway_response(error, request_id)

    def _authorize(
        self,
        method: Method,
        path: str,
        path_params: dict[str, str],
        query: dict[str, list[str]],
        headers: dict[str, str],
        multi_value_headers: dict[str, list[str]],
        identity: dict[str, Any],
        request_id: str,
    ) -> Any:
        assert method.authorizer is not None
        http_method = method.http_method
        method_arn = (
            f"arn:aws:execute-api:{LOCAL_REGION}:{LOCAL_ACCOUNT}:{self.api_id}/{self.stage}/{http_method}{path}"
        )
        context = {
            "resourcePath": method.resource_path,
            "httpMethod": http_method,
            "path": f"/{self.stage}{path}",
            "stage": self.stage,
            "requestId": request_id,
            "accountId": LOCAL_ACCOUNT,
            "apiId": self.api_id,
            "identity": identity,
        }
        try:
            return method.authorizer.authorize(
                Request(
                    method_arn=method_arn,
                    resource=method.resource_path,
                    path=path,
                    http_method=http_method,
                    headers=headers,
                    multi_value_headers=multi_value_headers,
                    query=query,
                    path_parameters=path_params,
                    request_context=context,
                )
            )
        except AuthorizerRefused as refused:
            raise GatewayError(refused.response_type, refused.message) from None

    def too_large(self) -> tuple[int, dict[str, str], bytes]:
        """The answer to a body over API Gateway's payload limit (the body is never read)."""
        return self._gateway_response(GatewayError("REQUEST_TOO_LARGE"), str(uuid.uuid4()))

    def _validate(self, method: Method, headers: dict[str, str], query: dict[str, list[str]]) -> None:
        missing = []
        for parameter in method.required_parameters:
            _, _, where, name = parameter.split(".", 3)
            present = (
                headers.get(name.lower())
                if where == "header"
                else (query.get(name) or [""])[0]
                if where == "querystring"
                else "path"
            )
            if not present:
                missing.append(name)
        if missing:
            raise GatewayError("BAD_REQUEST_PARAMETERS", f"Missing required request parameters: [{', '.join(missing)}]")

    def _proxy_event(
        self,
        method: Method,
        path: str,
        path_params: dict[str, str],
        query: dict[str, list[str]],
        headers: dict[str, str],
        body: bytes,
        identity: dict[str, Any],
        request_id: str,
    ) -> dict[str, Any]:
        content_type = {k.lower(): v for k, v in headers.items()}.get("content-type", "").split(";")[0].strip().lower()
        try:
            if self._is_binary(content_type):
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "a binary media type")
            text, is_base64 = body.decode("utf-8"), False
        except UnicodeDecodeError:
            text, is_base64 = base64.b64encode(body).decode(), True
        return {
            "resource": method.resource_path,
            "path": path,
            "httpMethod": method.http_method,
            "headers": headers,
            "multiValueHeaders": {k: [v] for k, v in headers.items()},
            "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
            "multiValueQueryStringParameters": query or None,
            "pathParameters": path_params or None,
            "stageVariables": None,
            "requestContext": {
                "resourcePath": method.resource_path,
                "httpMethod": method.http_method,
                "path": f"/{self.stage}{path}",
                "stage": self.stage,
                "requestId": request_id,
                "extendedRequestId": request_id,
                "requestTimeEpoch": int(time.time() * 1000),
                "accountId": LOCAL_ACCOUNT,
                "apiId": self.api_id,
                "protocol": "HTTP/1.1",
                "identity": identity,
            },
            "body": text if body else None,
            "isBase64Encoded": is_base64,
        }

    def _is_binary(self, content_type: str) -> bool:
        return any(fnmatch.fnmatchcase(content_type, pattern) for pattern in self.binary_media_types)

    @staticmethod
    def _proxy_response(payload: dict[str, Any], request_id: str) -> tuple[int, dict[str, str], bytes]:
        raw = payload.get("body") or ""
        data = base64.b64decode(raw) if payload.get("isBase64Encoded") else raw.encode()
        headers = {str(k): str(v) for k, v in (payload.get("headers") or {}).items()}
        for name, values in (payload.get("multiValueHeaders") or {}).items():
            headers[name] = ", ".join(str(v) for v in values)
        headers["x-amzn-RequestId"] = request_id
        return int(payload["statusCode"]), headers, data

    @staticmethod
    def _streamed_response(chunks: Iterator[bytes], request_id: str) -> tuple[int, dict[str, str], Body]:
        """The status and headers of a response stream's metadata, and its body's pieces as they come."""
        head = b""
        for chunk in chunks:
            head += chunk
            if _STREAM_DELIMITER in head:
                break
        if _STREAM_DELIMITER not in head:
            raise GatewayError("INTEGRATION_FAILURE", "the function's response stream has no metadata")
        metadata_json, _, first = head.partition(_STREAM_DELIMITER)
        try:
            metadata = json.loads(metadata_json or b"{}")
        except ValueError:
            raise GatewayError("INTEGRATION_FAILURE", "the response stream's metadata is not JSON") from None
        headers = {str(k): str(v) for k, v in (metadata.get("headers") or {}).items()}
        for name, values in (metadata.get("multiValueHeaders") or {}).items():
            headers[name] = ", ".join(str(v) for v in values)
        headers["x-amzn-RequestId"] = request_id

        def body() -> Iterator[bytes]:
            if first:
                yield first
            yield from chunks

        return int(metadata.get("statusCode", 200)), headers, body()

    def _gateway_response(self, error: GatewayError, request_id: str) -> tuple[int, dict[str, str], bytes]:
        status, default_message = _DEFAULTS[error.response_type]
        message = error.message or default_message
        family = "DEFAULT_5XX" if status >= 500 else "DEFAULT_4XX"
        spec = self.gateway_responses.get(error.response_type) or self.gateway_responses.get(family) or {}
        status = int(spec.get("StatusCode", status))
        template = (spec.get("ResponseTemplates") or {}).get("application/json")
        context = {
            "$context.error.messageString": json.dumps(message),
            "$context.error.message": message,
            "$context.error.responseType": error.response_type,
            "$context.error.validationErrorString": error.validation_errors,
            "$context.requestId": request_id,
        }
        if template is None:
            body = json.dumps({"message": message})
        else:
            body = template
            for name in sorted(context, key=len, reverse=True):
                body = body.replace(name, context[name])
        headers = {
            "Content-Type": "application/json",
            "x-amzn-RequestId": request_id,
            "x-amzn-ErrorType": _ERROR_TYPES.get(error.response_type, ""),
        }
        for name, value in (spec.get("ResponseParameters") or {}).items():
            headers[name.removeprefix("gatewayresponse.header.")] = str(value).strip("'")
        return status, headers, body.encode()


_ERROR_TYPES = {
    "MISSING_AUTHENTICATION_TOKEN": "MissingAuthenticationTokenException",
    "INVALID_API_KEY": "ForbiddenException",
    "BAD_REQUEST_BODY": "BadRequestException",
    "BAD_REQUEST_PARAMETERS": "BadRequestException",
    "REQUEST_TOO_LARGE": "RequestTooLargeException",
    "INTEGRATION_FAILURE": "InternalServerErrorException",
    "UNAUTHORIZED": "UnauthorizedException",
    "ACCESS_DENIED": "AccessDeniedException",
    "AUTHORIZER_FAILURE": "AuthorizerFunctionException",
    "AUTHORIZER_CONFIGURATION_ERROR": "AuthorizerConfigurationException",
    "THROTTLED": "TooManyRequestsException",
    "QUOTA_EXCEEDED": "LimitExceededException",
}


class _ApiKeys:
    """Enabled API keys that belong to a usage plan of this API, as moto's API Gateway holds them; looked up by
    value, re-read when a value is not known yet (a key created after start)."""

    def __init__(self, apigateway: Any, api_id: str) -> None:
        self._apigateway = apigateway
        self._api_id = api_id
        self._by_value: dict[str, str] = {}
        self._lock = threading.Lock()

    def key_id(self, value: str) -> str | None:
        with self._lock:
            if value not in self._by_value:
                planned = set()
                for plan in self._apigateway.get_usage_plans()["items"]:
                    if any(stage.get("apiId") == self._api_id for stage in plan.get("apiStages", [])):
                        planned |= {
                            k["id"] for k in self._apigateway.get_usage_plan_keys(usagePlanId=plan["id"])["items"]
                        }
                items = self._apigateway.get_api_keys(includeValues=True)["items"]
                self._by_value = {k["value"]: k["id"] for k in items if k.get("enabled", True) and k["id"] in planned}
            return self._by_value.get(value)


def serve(api: RestApi, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server handing every request to ``api`` (connections concurrently; each function runs one
    invocation at a time per execution environment, as Lambda does)."""

    class Gateway(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_PAYLOAD_BYTES:
                self.close_connection = True  # the body is not read
                status, headers, data = api.too_large()
            else:
                body = self.rfile.read(length) if length else b""
                # A repeated header keeps every value, as API Gateway's multiValueHeaders do (its headers: the last).
                multi: dict[str, list[str]] = {}
                for name, value in self.headers.items():
                    multi.setdefault(name, []).append(value)
                last = {name: values[-1] for name, values in multi.items()}
                status, headers, data = api.handle(self.command, self.path, last, body, self.client_address[0], multi)
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                    self.send_header(name, value)
            if isinstance(data, bytes):
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for piece in data:
                    if piece:  # an empty chunk would end the body
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            finally:
                close = getattr(data, "close", None)
                if close is not None:
                    close()  # frees the function's execution environment if the client went away

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

    server = ThreadingHTTPServer((host, port), Gateway)
    server.daemon_threads = True
    return server
