"""A small webhook endpoint on 127.0.0.1 that records (and optionally verifies) deliveries: for local runs, demos
and tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import WebhookVerificationError

from async_inference.webhooks.signing import verify


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)
    received_on: float = field(default_factory=time.time)  # wall clock, to compare with the job's timestamps


class Receiver:
    """A small webhook endpoint on 127.0.0.1: records each delivery and answers with ``statuses`` in turn, then 200.

    With ``secret`` it answers 401 to deliveries whose signature does not verify. With ``hang_s`` it records each
    delivery at once and answers only that many seconds later (a slow endpoint). For local runs, demos and tests.
    """

    def __init__(
        self, *, port: int = 0, statuses: Iterable[int] = (), secret: str | None = None, hang_s: float = 0
    ) -> None:
        self.deliveries: list[Delivery] = []
        self._statuses = list(statuses)
        self._secret = secret
        self._hang_s = hang_s
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver._record(dict(self.headers.items()), body)
                time.sleep(receiver._hang_s)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sender gave up waiting (a hanging receiver's usual end)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def _record(self, headers: dict[str, str], body: bytes) -> int:
        if self._secret is not None:
            try:
                verify(self._secret, headers, body)
            except WebhookVerificationError:
                return 401
        with self._lock:
            self.deliveries.append(Delivery(headers, body))
            self._lock.notify_all()
            return self._statuses.pop(0) if self._statuses else 200

    def wait_for(self, count: int, timeout_s: float) -> list[Delivery]:
        """The deliveries so far, once there are ``count`` of them or ``timeout_s`` has passed."""
        with self._lock:
            self._lock.wait_for(lambda: len(self.deliveries) >= count, timeout=timeout_s)
            return list(self.deliveries)

    def start(self) -> Receiver:
        threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
