"""One webhook delivery: a POST to a checked address, with TLS verified against the URL's host name, ended at a
deadline in wall time.

urllib3's timeouts bound each socket operation, not the response: a receiver that sends one header line a second
never lets a read wait 5 s, and held a delivery (and the dispatcher's batch) 60 s. So each attempt has a deadline,
``settings.WEBHOOK_DELIVERY_TIMEOUT_S`` from its start: a timer shuts the attempt's socket down then, which ends any
read or write in progress, and the attempt is a failure saying so.
"""

from __future__ import annotations

import socket
import threading
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
    timed_out: bool = False  # the receiver held the attempt to its deadline

    @property
    def delivered(self) -> bool:
        # 2xx only: a redirect is not followed and counts as a failure (following it would bypass the URL check).
        return self.status_code is not None and 200 <= self.status_code < 300


Poster = Callable[[Target, dict[str, str], bytes], PostResult]


class _Deadline:
    """Shuts down the sockets of a pool's connections when ``seconds`` have passed since ``start``."""

    def __init__(self, pool: urllib3.HTTPConnectionPool, seconds: float) -> None:
        self.seconds = seconds
        self.passed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        watched = self

        class Watched(pool.ConnectionCls):  # type: ignore[name-defined]
            def connect(self) -> None:
                super().connect()
                watched._watch(self.sock)

        pool.ConnectionCls = Watched
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            passed = self.passed
        if passed:  # connected just as the deadline passed
            self._shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.passed = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass


def _past_deadline(deadline_s: float) -> PostResult:
    return PostResult(status_code=None, error=f"no response status within {deadline_s:g} s", timed_out=True)


def post(
    target: Target,
    headers: dict[str, str],
    body: bytes,
    *,
    ca_certs: str | None = None,
    deadline_s: float = settings.WEBHOOK_DELIVERY_TIMEOUT_S,
) -> PostResult:
    """POST ``body`` to the first checked address of ``target``, with TLS verified against the URL's host name, and
    a status within ``deadline_s`` of wall time or a failed attempt.

    Connecting to the checked address (not to the host name) is what closes the DNS-rebinding window between the
    check and the connection; SNI and certificate checks still use the host name.
    """
    address = target.addresses[0]
    timeout = urllib3.Timeout(connect=settings.WEBHOOK_CONNECT_TIMEOUT_S, total=deadline_s)
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
    deadline = _Deadline(pool, deadline_s)
    deadline.start()
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
        if deadline.passed:  # http.client reads the end of input as the end of the headers: cut, not answered
            return _past_deadline(deadline_s)
        return PostResult(status_code=response.status)
    except Exception as exc:  # any transport failure is one failed attempt, never a crashed batch
        if deadline.passed:
            return _past_deadline(deadline_s)
        return PostResult(status_code=None, error=f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
    finally:
        deadline.cancel()
        pool.close()
