"""Each tenant's webhook signing secrets: where the dispatcher reads them, and in what form."""

from __future__ import annotations

from typing import Callable, Mapping, Union

from async_inference.config import DispatcherSettings

SECRET_CACHE_S = 300  # a rotated secret is picked up within this long

SecretValue = Union[str, list[str]]


class TenantSecrets:
    """Each tenant's signing secrets: ``{"tenant": "whsec_..."}`` or ``{"tenant": ["whsec_new", "whsec_old"]}``."""

    def __init__(self, load: Callable[[], Mapping[str, SecretValue]]) -> None:
        self._load = load

    def for_tenant(self, tenant: str) -> list[str]:
        """The tenant's secrets, newest first; KeyError when it has none."""
        value = self._load().get(tenant)
        if not value:
            raise KeyError(f"no webhook signing secret for tenant {tenant!r}")
        return [value] if isinstance(value, str) else list(value)

    @classmethod
    def from_settings(cls, config: DispatcherSettings) -> TenantSecrets:
        """Inline JSON locally (``WEBHOOK_SECRETS_JSON``); in AWS the Secrets Manager secret ``WEBHOOK_SECRET_ARN``,
        fetched through Powertools so a warm Lambda reads it once per ``SECRET_CACHE_S``."""
        if config.webhook_secrets_json is not None:
            table = config.webhook_secrets_json
            return cls(lambda: table)
        arn = config.webhook_secret_arn
        from aws_lambda_powertools.utilities import parameters

        return cls(lambda: parameters.get_secret(arn, transform="json", max_age=SECRET_CACHE_S))  # type: ignore[return-value]
