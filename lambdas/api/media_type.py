"""The media type of a request body: this API reads JSON only, in UTF-8.

``application/json`` is accepted in any case, with or without a ``charset`` of UTF-8 (or its ASCII subset), and so
is any structured ``+json`` type (RFC 6839); no ``Content-Type`` at all is read as JSON. Anything else that carries a
body is refused with a 415 naming the type to send, before Powertools' parser sees it: Powertools matches
``application/json`` case-sensitively, parses form encoding into fields (so ``curl -d`` got a baffling 400 naming the
whole body as an unknown field) and raises an unhandled error for other types.
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"
_UTF8_CHARSETS = {"utf-8", "utf8", "us-ascii"}


def _header(event: dict[str, Any], name: str) -> str | None:
    for key, value in (event.get("headers") or {}).items():
        if key.lower() == name:
            return value
    return None


def is_json(content_type: str | None) -> bool:
    """Whether ``content_type`` names JSON (``application/json`` or ``*/*+json``, any case, any parameters)."""
    media = (content_type or "").split(";")[0].strip().lower()
    return media == JSON or (media.startswith("application/") and media.endswith("+json"))


def refusal(content_type: str | None, *, has_body: bool) -> str | None:
    """Why a body of ``content_type`` cannot be read here (the message of a 415), or None when it can."""
    if not (content_type or "").strip():
        return None
    media, *parameters = [part.strip() for part in content_type.split(";")]  # type: ignore[union-attr]
    if not is_json(media):
        return (
            f"the request body must be JSON: send Content-Type: {JSON} (got {media or content_type!r})"
            if has_body
            else None
        )
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in _UTF8_CHARSETS:
            return f"the request body must be UTF-8 JSON: send Content-Type: {JSON} (got charset {value.strip()!r})"
    return None


def normalize(event: dict[str, Any]) -> str | None:
    """Refuse a body that is not JSON (the 415 message), or rewrite a JSON ``Content-Type`` in ``event`` to plain
    ``application/json``, the one spelling the route validation parses; None when the request may go on."""
    content_type = _header(event, "content-type")
    reason = refusal(content_type, has_body=bool(event.get("body")))
    if reason is not None or not is_json(content_type):
        return reason
    for section, value in (("headers", JSON), ("multiValueHeaders", [JSON])):
        headers = event.get(section) or {}
        for key in [k for k in headers if k.lower() == "content-type"]:
            headers[key] = value
    return None
