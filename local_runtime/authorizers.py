"""``AWS::ApiGateway::Authorizer`` (Lambda, REQUEST type) for the local REST API, read from the template, as API Gateway
runs it:

* the identity sources (``IdentitySource``): with caching on (``AuthorizerResultTtlInSeconds`` > 0, 300 when unset),
  every one must be present and non-empty, or the answer is 401 (``UNAUTHORIZED``) without a call; their values are
  the cache key, and a cached result is used for the TTL. With TTL 0 nothing is checked or cached;
* the call: the REQUEST event API Gateway sends (``type``, ``methodArn``, the request's path, headers, query and
  path parameters, its ``requestContext``) to the function the authorizer's URI names;
* the answer: a function error whose message is ``Unauthorized`` is 401 (``UNAUTHORIZED``), any other error or a
  malformed answer 500 (``AUTHORIZER_FAILURE``, ``AUTHORIZER_CONFIGURATION_ERROR``); the policy is evaluated against
  the method ARN (an explicit Deny wins; no Allow is 403 ``ACCESS_DENIED``); ``context`` and ``principalId`` go to the
  integration's ``requestContext.authorizer``, ``usageIdentifierKey`` is the API key when the API's key source is
  AUTHORIZER.
"""

from __future__ import annotations

import fnmatch
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from local_runtime.functions import LocalFunction

DEFAULT_TTL_S = 300  # API Gateway's default when AuthorizerResultTtlInSeconds is unset
_SOURCE = re.compile(r"^method\.request\.(header|querystring)\.(.+)$|^(stageVariables|context)\.(.+)$")


class AuthorizerRefused(Exception):
    """The authorizer's refusal, as the gateway response type API Gateway answers with."""

    def __init__(self, response_type: str, message: str | None = None) -> None:
        super().__init__(response_type)
        self.response_type = response_type
        self.message = message


@dataclass(frozen=True)
class Authorized:
    principal_id: str
    context: dict[str, Any]
    usage_identifier_key: str | None


@dataclass
class Request:
    """What the authorizer event is built from (the local gateway's view of one request)."""

    method_arn: str
    resource: str
    path: str
    http_method: str
    headers: dict[str, str]
    query: dict[str, list[str]]
    path_parameters: dict[str, str]
    request_context: dict[str, Any]
    stage_variables: dict[str, str] = field(default_factory=dict)
    # Every value of each header (``headers`` holds the last one, as API Gateway's event does); None: one each.
    multi_value_headers: dict[str, list[str]] | None = None


class RequestAuthorizer:
    def __init__(
        self,
        logical_id: str,
        properties: dict[str, Any],
        function: LocalFunction,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if properties.get("Type") != "REQUEST":
            raise ValueError(f"{logical_id}: only REQUEST authorizers run locally, not {properties.get('Type')}")
        self.logical_id = logical_id
        self.function = function
        self.ttl_s = int(properties.get("AuthorizerResultTtlInSeconds", DEFAULT_TTL_S))
        raw = properties.get("IdentitySource") or ""
        self.identity_sources = [s.strip() for s in raw.split(",") if s.strip()]
        for source in self.identity_sources:
            if not _SOURCE.match(source):
                raise ValueError(f"{logical_id}: identity source {source!r} is not one the local gateway reads")
        if self.ttl_s > 0 and not self.identity_sources:
            raise ValueError(
                f"{logical_id}: caching is on (TTL {self.ttl_s} s) but no identity source is given, "
                "which API Gateway refuses"
            )
        self._clock = clock
        self._cache: dict[tuple[str, ...], tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.invocations = 0

    def authorize(self, request: Request) -> Authorized:
        key: tuple[str, ...] | None = None
        if self.ttl_s > 0:
            values = [self._identity(source, request) for source in self.identity_sources]
            if not all(values):
                raise AuthorizerRefused("UNAUTHORIZED")  # API Gateway does not call the function then
            key = tuple(values)  # type: ignore[arg-type]
            with self._lock:
                cached = self._cache.get(key)
            if cached is not None and self._clock() - cached[0] < self.ttl_s:
                return self._evaluate(cached[1], request.method_arn)
        answer = self._invoke(request)
        if key is not None:
            with self._lock:
                self._cache[key] = (self._clock(), answer)
        return self._evaluate(answer, request.method_arn)

    def _invoke(self, request: Request) -> dict[str, Any]:
        self.invocations += 1
        event = {
            "type": "REQUEST",
            "methodArn": request.method_arn,
            "resource": request.resource,
            "path": request.path,
            "httpMethod": request.http_method,
            "headers": request.headers,
            "multiValueHeaders": request.multi_value_headers or {k: [v] for k, v in request.headers.items()},
            "queryStringParameters": {k: v[-1] for k, v in request.query.items()},
            "multiValueQueryStringParameters": request.query,
            "pathParameters": request.path_parameters,
            "stageVariables": request.stage_variables,
            "requestContext": request.request_context,
        }
        result = self.function.invoke(event)
        if result.error:
            if isinstance(result.payload, dict) and result.payload.get("errorMessage") == "Unauthorized":
                raise AuthorizerRefused("UNAUTHORIZED")
            raise AuthorizerRefused("AUTHORIZER_FAILURE")
        if (
            not isinstance(result.payload, dict)
            or "policyDocument" not in result.payload
            or "principalId" not in result.payload
        ):
            raise AuthorizerRefused("AUTHORIZER_CONFIGURATION_ERROR")
        return result.payload

    @staticmethod
    def _identity(source: str, request: Request) -> str | None:
        match = _SOURCE.match(source)
        assert match is not None
        where, name = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        if where == "header":
            return {k.lower(): v for k, v in request.headers.items()}.get(name.lower()) or None
        if where == "querystring":
            return (request.query.get(name) or [""])[-1] or None
        if where == "stageVariables":
            return request.stage_variables.get(name) or None
        value: Any = request.request_context
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return str(value) if value else None

    @staticmethod
    def _evaluate(answer: dict[str, Any], method_arn: str) -> Authorized:
        statements = answer["policyDocument"].get("Statement", [])
        statements = statements if isinstance(statements, list) else [statements]
        allowed = denied = False
        for statement in statements:
            actions = statement.get("Action", [])
            actions = actions if isinstance(actions, list) else [actions]
            if not any(fnmatch.fnmatchcase("execute-api:Invoke", a) for a in actions):
                continue
            resources = statement.get("Resource", [])
            resources = resources if isinstance(resources, list) else [resources]
            if any(fnmatch.fnmatchcase(method_arn, r) for r in resources):
                if statement.get("Effect") == "Deny":
                    denied = True
                elif statement.get("Effect") == "Allow":
                    allowed = True
        if denied or not allowed:
            raise AuthorizerRefused("ACCESS_DENIED")
        context = answer.get("context") or {}
        if not isinstance(context, dict) or any(isinstance(v, (dict, list)) for v in context.values()):
            raise AuthorizerRefused("AUTHORIZER_CONFIGURATION_ERROR")  # context values must be flat
        key = answer.get("usageIdentifierKey")
        return Authorized(
            principal_id=str(answer["principalId"]), context=context, usage_identifier_key=str(key) if key else None
        )
