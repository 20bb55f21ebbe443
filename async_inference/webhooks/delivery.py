"""One webhook delivery: a POST to a checked address, with TLS verified against the URL's host name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3

from async_inference import settings
from async_inference.webhooks.url_safety import Target

MAX_ERROR_CHARS = 200


@dataclass(frozen=True)
class PostResult:
    status_code: int | None
    error: str | None = None

    @property
    def delivered(self) -> bool:
        # 2xx only: a redirect is not followed and counts as a failure (following it would bypass the URL check).
        return self.status_code is not None and 200 <= self.status_code < 300


Poster = Callable[[Target, dict[str, str], bytes], PostResult]


def post(target: Target, headers: dict[str, str], body: bytes, *, ca_certs: str | None = None) -> PostResult:
    """POST ``body`` to the first checked address of ``target``, with TLS verified against the URL's host name.

    Connecting to the checked address (not to the host name) is what closes the DNS-rebinding window between the
    check and the connection; SNI and certificate checks still use the host name.
    """
    address = target.addresses[0]
    timeout = urllib3.Timeout(connect=settings.WEBHOOK_CONNECT_TIMEOUT_S, total=settings.WEBHOOK_DELIVERY_TIMEOUT_S)
    common: dict[str, Any] = dict(host=address, port=target.port, timeout=timeout, retries=False, maxsize=1)
    if target.scheme == "https":
        pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
            **common,
            server_hostname=target.host,
            assert_hostname=target.host,
            cert_reqs="CERT_REQUIRED",
            ca_certs=ca_certs,
        )
    else:
        pool = urllib3.HTTPConnectionPool(**common)
    request_headers = {**headers, "Host": target.host_header, "User-Agent": "async-inference-webhooks/1"}
    try:
        response = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers=request_headers,
            redirect=False,
            preload_content=False,
            assert_same_host=False,
        )
        response.release_conn()  # the body is never read: a receiver cannot make us download anything
        return PostResult(status_code=response.status)
    except Exception as exc:  # any transport failure is one failed attempt, never a crashed batch
        return PostResult(status_code=None, error=f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
    finally:
        pool.close()
