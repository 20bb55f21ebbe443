"""Stand-ins the client's tests talk to over real sockets: an HTTP server answering from the test's function, a
WebSocket server speaking the push protocol from the test's function, and a clock that only moves when slept on.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

JOB_ID = "job_" + "ab" * 16
OTHER_JOB_ID = "job_" + "cd" * 16


@dataclass
class FakeTime:
    """``clock()`` and ``sleep()`` for a client: time moves by exactly what the client sleeps, and each sleep is kept."""

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without answering

    @classmethod
    def dropped(cls) -> Reply:
        return cls(drop=True)


def job_view(status: str = "running", job_id: str = JOB_ID, **extra: Any) -> dict[str, Any]:
    """A JobView body as the API returns it."""
    return {"job_id": job_id, "status": status, "created_at": "2026-12-01T10:00:00Z", **extra}


def succeeded_view(api_url: str, job_id: str = JOB_ID) -> dict[str, Any]:
    """A succeeded job whose presigned result URL is served by the same fake API (``/results/{job_id}``)."""
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    return job_view(
        "succeeded",
        job_id,
        result={"url": f"{api_url}/results/{job_id}", "expires_at": expires},
        usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    )


def completion(job_id: str = JOB_ID, content: str = "the answer") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "job_id": job_id,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


class FakeApi:
    """An HTTP server on 127.0.0.1 whose every answer comes from ``respond(seen)``; ``seen`` keeps every request."""

    def __init__(self, respond: Callable[[Seen], Reply]) -> None:
        self.respond = respond
        self.seen: list[Seen] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: with Nagle's algorithm on, the client's delayed ACK holds the
            # second ~40 ms, and a test of a thousand polls takes a minute.
            disable_nagle_algorithm = True

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Seen(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length)
                )
                fake.seen.append(request)
                reply = fake.respond(request)
                if reply.drop:
                    self.close_connection = True
                    return
                body = (
                    b""
                    if reply.body is None
                    else (reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode())
                )
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _any

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def gets(self, path: str = f"/v1/jobs/{JOB_ID}") -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path == path]

    def __enter__(self) -> FakeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakePush:
    """A WebSocket server on 127.0.0.1 that hands each connection to ``converse(connection)`` and keeps what each
    client sent on connecting: its headers and its first message (the subscription)."""

    def __init__(
        self,
        converse: Callable[[ServerConnection, dict[str, Any]], None],
        *,
        reply: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        """``reply`` answers the subscription, as the WebSocket API does (default: ``{"type": "subscribed", ...}``;
        None from it: no answer)."""
        self.converse = converse
        self.reply = reply or subscribed
        self.headers: list[dict[str, str]] = []
        self.subscriptions: list[dict[str, Any]] = []
        self.replied_at: list[float] = []  # time.monotonic() of each reply
        self._server = serve(self._handle, "127.0.0.1", 0)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handle(self, connection: ServerConnection) -> None:
        assert connection.request is not None
        self.headers.append({k.lower(): v for k, v in connection.request.headers.raw_items()})
        subscription = json.loads(connection.recv(timeout=10))
        self.subscriptions.append(subscription)
        answer = self.reply(subscription)
        if answer is not None:
            self.replied_at.append(time.monotonic())
            connection.send(answer)
        self.converse(connection, subscription)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self._server.socket.getsockname()[1]}"

    def __enter__(self) -> FakePush:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()


def subscribed(subscription: dict[str, Any]) -> str:
    """The WebSocket API's reply to a subscription."""
    return json.dumps({"type": "subscribed", **{k: v for k, v in subscription.items() if k != "action"}})


def event(type_: str, job_id: str = JOB_ID, **extra: Any) -> str:
    return json.dumps({"type": type_, "job_id": job_id, **extra})


def until_closed(connection: ServerConnection, timeout_s: float = 10.0) -> None:
    """Hold the connection open until the client closes it."""
    try:
        while True:
            connection.recv(timeout=timeout_s)
    except (ConnectionClosed, TimeoutError):
        pass
