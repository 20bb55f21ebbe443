"""API Gateway's API keys: the tenant a key belongs to (``TenantDirectory``) and every key's value
(``ApiKeyValues``)."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from async_inference.aws.clients import client, is_error


class TenantDirectory:
    """Tenant of an API Gateway API key: the key's name. Cached, since keys are not renamed."""

    def __init__(self, apigateway: Any | None = None) -> None:
        self._apigateway = apigateway or client("apigateway")
        self._cache: dict[str, str | None] = {}

    def tenant_of(self, api_key_id: str) -> str | None:
        if api_key_id not in self._cache:
            try:
                self._cache[api_key_id] = self._apigateway.get_api_key(apiKey=api_key_id, includeValue=False)["name"]
            except ClientError as exc:
                if not is_error(exc, "NotFoundException"):
                    raise
                self._cache[api_key_id] = None
        return self._cache[api_key_id]


class ApiKeyValues:
    """Every API key of the account in the region, with its value: key id -> (value, enabled), from ``GetApiKeys``
    pages of ``PAGE_SIZE`` (one call up to that many keys)."""

    PAGE_SIZE = 500  # GetApiKeys' largest page (its limit parameter, API Gateway REST API reference)

    def __init__(self, apigateway: Any | None = None) -> None:
        self._apigateway = apigateway or client("apigateway")

    def __call__(self) -> dict[str, tuple[str, bool]]:
        found: dict[str, tuple[str, bool]] = {}
        position: dict[str, str] = {}
        while True:
            page = self._apigateway.get_api_keys(includeValues=True, limit=self.PAGE_SIZE, **position)
            for key in page.get("items", []):
                found[key["id"]] = (key["value"], bool(key.get("enabled", True)))
            if not page.get("position"):
                return found
            position = {"position": page["position"]}
