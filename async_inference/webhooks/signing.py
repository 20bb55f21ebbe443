"""Standard Webhooks signatures: fresh secrets, the ``webhook-*`` headers of a delivery, and their verification."""

from __future__ import annotations

import base64
import datetime as dt
import secrets as _secrets
from collections.abc import Iterable, Mapping
from typing import Any

from standardwebhooks import Webhook

from async_inference.schemas import utcnow


def new_secret() -> str:
    """A fresh signing secret in the Standard Webhooks form: ``whsec_`` and 32 random bytes, base64."""
    return "whsec_" + base64.b64encode(_secrets.token_bytes(32)).decode()


def signed_headers(
    secrets: Iterable[str], msg_id: str, body: str, *, timestamp: dt.datetime | None = None
) -> dict[str, str]:
    """The ``webhook-*`` headers for ``body``. During a rotation the tenant has two secrets: one signature each,
    space-separated, so a receiver holding either one verifies."""
    timestamp = timestamp or utcnow()
    signatures = " ".join(Webhook(s).sign(msg_id, timestamp, body) for s in secrets)
    if not signatures:
        raise KeyError("no signing secret")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signatures,
        "content-type": "application/json",
    }


def verify(secret: str, headers: Mapping[str, str], body: bytes | str) -> dict[str, Any]:
    """The delivery's JSON payload if its signature is valid and its timestamp within five minutes;
    standardwebhooks.WebhookVerificationError otherwise."""
    return Webhook(secret).verify(body, dict(headers))
