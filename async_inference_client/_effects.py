"""Effects: what an operation asks its client to do (send a request, sleep, open, use and close a WebSocket), and
``Run``, one operation being carried out. ``_base_client`` writes the operations; ``client`` carries out their
effects, blocking or awaiting."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One HTTP request, as both clients send it."""

    method: str
    url: str
    headers: dict[str, str]
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    files: dict[str, Any] | None = None  # multipart parts (the Files API)
    data: dict[str, Any] | None = None  # multipart fields
    # Whether sending it twice is harmless: only then is a request that got no answer sent again.
    resend_safe: bool = False

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``httpx2.Client.request`` (and of the async one)."""
        return {
            "method": self.method,
            "url": self.url,
            "headers": self.headers,
            "json": self.json,
            "content": self.content,
            "params": self.params,
            "files": self.files,
            "data": self.data,
        }


@dataclass(frozen=True)
class Send:
    """Send ``call`` once; the outcome is the response (of any status)."""

    call: Call


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Connect:
    """Open a WebSocket; the outcome is the socket."""

    url: str
    options: dict[str, Any]


@dataclass(frozen=True)
class Transmit:
    socket: Any
    text: str


@dataclass(frozen=True)
class Receive:
    """The socket's next message; TimeoutError when none came within ``timeout_s``."""

    socket: Any
    timeout_s: float


@dataclass(frozen=True)
class Disconnect:
    socket: Any


Effect = Send | Sleep | Connect | Transmit | Receive | Disconnect
Flow = Generator[Effect, Any, T]


class Run(Generic[T]):
    """One operation being carried out: ``effect`` is what it waits for until ``done``; then ``value`` is its result.
    An effect that raised is thrown into the operation, which may handle it (a refused connection is retried)."""

    effect: Effect
    value: T

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self.done = False
        self.succeeded(None)

    def succeeded(self, outcome: Any) -> None:
        self._step(lambda: self._flow.send(outcome))

    def failed(self, error: BaseException) -> None:
        self._step(lambda: self._flow.throw(error))

    def _step(self, advance: Callable[[], Effect]) -> None:
        try:
            self.effect = advance()
        except StopIteration as stop:
            self.done, self.value = True, stop.value
