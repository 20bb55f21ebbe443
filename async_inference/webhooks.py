"""Per-job webhooks: URL checks against SSRF, Standard Webhooks signing, the retry schedule, delivery, and the
dispatcher that turns one message on the webhook queue into one signed POST.

How a delivery travels: the result topic feeds the webhook queue (raw delivery), and the worker sends a "started"
event to the same queue. The dispatcher Lambda reads a batch, and for each message whose job asked for that event it
checks the URL again, signs the body with the tenant's secret and POSTs it. A failed POST hides the message for the
backoff of its receive count and reports it failed; SQS redelivers it, and after ``WEBHOOK_MAX_RECEIVE_COUNT``
receives moves it to the webhook DLQ. The result never depends on the webhook: it stays in S3 and on the job.

``python -m async_inference.webhooks verify|receive|new-secret`` is the receiving side's helper (see
``docs/notifications.md``).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import json
import logging
import random
import secrets as _secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Literal, Mapping, Union
from urllib.parse import urlsplit

import urllib3
from pydantic import BaseModel, Field, ValidationError
from standardwebhooks import Webhook, WebhookVerificationError

from async_inference import settings
from async_inference.config import ENV_BACKOFF_BASE_S, ENV_BACKOFF_MAX_S, DispatcherSettings  # noqa: F401 (re-exported)
from async_inference.jobs import JobStatus
from async_inference.schemas import SCHEMA_VERSION, Job, ResultNotification, utcnow

logger = logging.getLogger(__name__)

EVENT_COMPLETED = "completed"
EVENT_STARTED = "started"

MAX_URL_CHARS = 2048  # the same bound as schemas.WebhookSpec.url
# A receiver has this long to connect and answer; it should queue the work and answer 2xx at once.
CONNECT_TIMEOUT_S = 3.0
DELIVERY_TIMEOUT_S = 5.0
# The dispatcher delivers a batch one message at a time: its Lambda timeout must cover a full batch of slow receivers,
# and the queue's visibility timeout must outlive the Lambda (AWS recommends six times the function timeout).
DISPATCH_BATCH_SIZE = 10
DISPATCHER_TIMEOUT_S = 90
QUEUE_VISIBILITY_TIMEOUT_S = 6 * DISPATCHER_TIMEOUT_S
SQS_MAX_VISIBILITY_S = 12 * 60 * 60  # ChangeMessageVisibility's upper limit
# Jitter is added on top of the schedule, never taken off, so the retries span at least webhook_retry_span_s().
JITTER_FRACTION = 0.1
SECRET_CACHE_S = 300  # a rotated secret is picked up within this long
MAX_ERROR_CHARS = 200

# Where cloud providers serve instance metadata and credentials: named in refusals so the reason is plain.
_METADATA = {
    ipaddress.ip_address("169.254.169.254"),  # EC2/ECS/most clouds (IPv4)
    ipaddress.ip_address("169.254.170.2"),  # ECS task credentials
    ipaddress.ip_address("fd00:ec2::254"),  # EC2 (IPv6)
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


# --- URL checks (SSRF) ----------------------------------------------------------------------------------------------


class UnsafeUrl(ValueError):
    """A webhook URL that must not be called; the message says why, for a 400 or an attempt record."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL and the addresses it resolved to; delivery connects to these and nothing else."""

    url: str
    scheme: Literal["http", "https"]
    host: str
    port: int
    path: str  # path and query, as sent on the request line
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA); UnsafeUrl when it resolves to none."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeUrl(f"the host {host!r} does not resolve") from exc
    return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64): those reach the IPv4 host."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal(address: str, *, allow_local: bool = False) -> str | None:
    """Why a webhook may not be sent to ``address``, or None when it may."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _embedded_ipv4(ip) or ip
    if ip in _METADATA:
        return f"{address} is a cloud metadata address"
    if ip.is_loopback:
        return None if allow_local else f"{address} is a loopback address"
    if ip.is_link_local:
        return f"{address} is a link-local address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return f"{address} is not a unicast address"
    if ip.is_private:
        return f"{address} is a private address"
    if not ip.is_global:
        return f"{address} is not a public address"
    return None


def check_url(url: str, *, allow_local: bool = False, resolver: Resolver = resolve) -> Target:
    """The URL as a delivery target, after resolving its host and checking every address; UnsafeUrl otherwise.

    Called at submit time and again before every delivery: a host that resolved to a public address when the job
    was submitted may resolve to 169.254.169.254 an hour later (DNS rebinding). Delivery then connects to the
    addresses checked here, so no second lookup happens between the check and the connection.
    """
    if len(url) > MAX_URL_CHARS:
        raise UnsafeUrl(f"the URL is longer than {MAX_URL_CHARS} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise UnsafeUrl("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"the URL is not valid: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or (scheme == "http" and not allow_local):
        raise UnsafeUrl("the URL must start with https://")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("the URL must not contain credentials (user:password@)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UnsafeUrl("the URL has no host")
    port = port or (443 if scheme == "https" else 80)
    addresses = resolver(host, port)
    if not addresses:
        raise UnsafeUrl(f"the host {host!r} does not resolve")
    for address in addresses:
        reason = refusal(address, allow_local=allow_local)
        if reason:
            raise UnsafeUrl(f"the host {host!r} resolves to a refused address: {reason}")
    if scheme == "http" and not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise UnsafeUrl("the URL must start with https:// (http is allowed for 127.0.0.1 only, and only locally)")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(url=url, scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))  # type: ignore[arg-type]


# --- Signing (Standard Webhooks) ------------------------------------------------------------------------------------


def new_secret() -> str:
    """A fresh signing secret in the Standard Webhooks form: ``whsec_`` and 32 random bytes, base64."""
    return "whsec_" + base64.b64encode(_secrets.token_bytes(32)).decode()


def signed_headers(secrets: Iterable[str], msg_id: str, body: str, *, timestamp: dt.datetime | None = None) -> dict[str, str]:
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


# --- Retry schedule -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backoff:
    """Seconds to hide a message after its n-th failed receive: min(base * 2**(n-1), max), plus up to 10% jitter so
    that receivers that failed together are not retried together."""

    base_s: int = settings.WEBHOOK_BACKOFF_BASE_S
    max_s: int = settings.WEBHOOK_BACKOFF_MAX_S

    def delay_s(self, receive_count: int, rand: Callable[[], float] = random.random) -> int:
        n = min(max(receive_count, 1), 32)  # 2**31 * base is past any max already
        ceiling = min(self.base_s * 2 ** (n - 1), self.max_s)
        return min(int(round(ceiling * (1 + JITTER_FRACTION * rand()))), SQS_MAX_VISIBILITY_S)

    @classmethod
    def from_settings(cls, config: DispatcherSettings) -> Backoff:
        return cls(base_s=config.webhook_backoff_base_s, max_s=config.webhook_backoff_max_s)


# --- Messages on the webhook queue ----------------------------------------------------------------------------------


class JobStartedEvent(BaseModel):
    """The body of a ``started`` webhook: sent when a worker starts running the job."""

    schema_version: Literal["1"] = SCHEMA_VERSION
    event: Literal["job.started"] = "job.started"
    job_id: str
    tenant: str
    status: JobStatus
    model: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at: dt.datetime
    started_at: dt.datetime
    attempt: int = Field(description="1 on the first run; higher when the job was redelivered after a worker crash.")

    @classmethod
    def of(cls, job: Job) -> JobStartedEvent:
        return cls(
            job_id=job.job_id,
            tenant=job.tenant,
            status=job.status,
            model=job.model,
            metadata=job.metadata,
            created_at=job.created_at,
            started_at=job.started_at or utcnow(),
            attempt=job.attempts,
        )


@dataclass(frozen=True)
class QueuedEvent:
    kind: Literal["completed", "started"]
    job_id: str
    body: str  # exactly what the receiver gets, and what is signed

    @property
    def msg_id(self) -> str:
        # The same id on every retry and every duplicate: receivers dedupe on webhook-id.
        return f"{self.job_id}_{self.kind}"


def parse_queued(body: str) -> QueuedEvent | None:
    """A message from the webhook queue, or None when it is not one of ours (logged and dropped by the caller)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("Type") == "Notification" and "Message" in data:
        # Raw delivery is off on the subscription: the notification is inside SNS's envelope.
        body = data["Message"]
        try:
            data = json.loads(body)
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    try:
        if data.get("event") == "job.started":
            return QueuedEvent(EVENT_STARTED, JobStartedEvent.model_validate(data).job_id, body)
        return QueuedEvent(EVENT_COMPLETED, ResultNotification.model_validate(data).job_id, body)
    except ValidationError:
        return None


# --- Delivery -------------------------------------------------------------------------------------------------------


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
    timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_S, total=DELIVERY_TIMEOUT_S)
    common: dict[str, Any] = dict(host=address, port=target.port, timeout=timeout, retries=False, maxsize=1)
    if target.scheme == "https":
        pool: urllib3.HTTPConnectionPool = urllib3.HTTPSConnectionPool(
            **common, server_hostname=target.host, assert_hostname=target.host, cert_reqs="CERT_REQUIRED", ca_certs=ca_certs
        )
    else:
        pool = urllib3.HTTPConnectionPool(**common)
    request_headers = {**headers, "Host": target.host_header, "User-Agent": "async-inference-webhooks/1"}
    try:
        response = pool.urlopen(
            "POST", target.path, body=body, headers=request_headers, redirect=False, preload_content=False,
            assert_same_host=False,
        )
        response.release_conn()  # the body is never read: a receiver cannot make us download anything
        return PostResult(status_code=response.status)
    except Exception as exc:  # any transport failure is one failed attempt, never a crashed batch
        return PostResult(status_code=None, error=f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS])
    finally:
        pool.close()


@dataclass(frozen=True)
class Outcome:
    """What became of one queued event: done (delivered, or nothing to deliver), or retry after ``retry_in_s``."""

    done: bool
    retry_in_s: int = 0
    reason: str = ""
    job_id: str | None = None


class Dispatcher:
    """Delivers queued events to the URLs their jobs asked for and records every attempt on the job."""

    def __init__(
        self,
        *,
        store: Any,  # aws.JobStore
        secrets: TenantSecrets,
        allow_local: bool = False,
        backoff: Backoff | None = None,
        max_receives: int = settings.WEBHOOK_MAX_RECEIVE_COUNT,
        resolver: Resolver = resolve,
        poster: Poster = post,
    ) -> None:
        self.store = store
        self.secrets = secrets
        self.allow_local = allow_local
        self.backoff = backoff or Backoff()
        self.max_receives = max_receives
        self._resolver = resolver
        self._post = poster

    def dispatch(self, body: str, receive_count: int) -> Outcome:
        event = parse_queued(body)
        if event is None:
            logger.error("dropping a message that is not a job event")
            return Outcome(done=True, reason="not a job event")
        job = self.store.get(event.job_id)
        if job is None or job.webhook is None or event.kind not in job.webhook.events:
            return Outcome(done=True, reason="no webhook for this event", job_id=event.job_id)
        decides_status = event.kind == EVENT_COMPLETED or EVENT_COMPLETED not in job.webhook.events
        if decides_status and job.webhook.status == "delivered":
            return Outcome(done=True, reason="delivered already", job_id=job.job_id)  # a duplicate notification

        result = self._attempt(job, event)
        last = receive_count >= self.max_receives
        status = None
        if decides_status and (result.delivered or last):
            status = "delivered" if result.delivered else "failed"
        attempt = {"at": utcnow().isoformat(), "event": event.kind, "receive_count": receive_count}
        if result.status_code is not None:
            attempt["status_code"] = result.status_code
        if result.error:
            attempt["error"] = result.error
        elif not result.delivered:
            attempt["error"] = f"HTTP {result.status_code}"
        self.store.record_webhook_attempt(job.job_id, attempt, status=status)
        if result.delivered:
            return Outcome(done=True, reason="delivered", job_id=job.job_id)
        # After the last receive the message is not hidden: the next receive moves it to the DLQ.
        retry_in_s = 0 if last else self.backoff.delay_s(receive_count)
        return Outcome(done=False, retry_in_s=retry_in_s, reason=attempt["error"], job_id=job.job_id)

    def _attempt(self, job: Job, event: QueuedEvent) -> PostResult:
        assert job.webhook is not None
        try:
            target = check_url(job.webhook.url, allow_local=self.allow_local, resolver=self._resolver)
        except UnsafeUrl as exc:
            return PostResult(status_code=None, error=f"refused: {exc}"[:MAX_ERROR_CHARS])
        try:
            headers = signed_headers(self.secrets.for_tenant(job.tenant), event.msg_id, event.body)
        except KeyError as exc:
            logger.error("cannot sign webhook for tenant %s: %s", job.tenant, exc)
            return PostResult(status_code=None, error="the service has no signing secret for this tenant")
        return self._post(target, headers, event.body.encode())


# --- The "started" event (called by the worker) ---------------------------------------------------------------------

def started_event(job: Job, queue: Any) -> bool:
    """Queue the job's ``started`` webhook on ``queue`` (an ``aws.WebhookQueue``) if it asked for one; True when
    queued. Call it after the RUNNING transition.

    Never raises: a started notice is informational and must not cost the job its run.
    """
    if job.webhook is None or EVENT_STARTED not in job.webhook.events:
        return False
    try:
        queue.send(JobStartedEvent.of(job).model_dump_json(exclude_none=True))
    except Exception:
        logger.exception("job %s: could not queue its started webhook", job.job_id)
        return False
    return True


# --- The receiving side: verify a delivery, or run a receiver that does ---------------------------------------------


def verify(secret: str, headers: Mapping[str, str], body: bytes | str) -> dict[str, Any]:
    """The delivery's JSON payload if its signature is valid and its timestamp within five minutes;
    standardwebhooks.WebhookVerificationError otherwise."""
    return Webhook(secret).verify(body, dict(headers))


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)


class Receiver:
    """A small webhook endpoint on 127.0.0.1: records each delivery and answers with ``statuses`` in turn, then 200.

    With ``secret`` it answers 401 to deliveries whose signature does not verify. For local runs, demos and tests.
    """

    def __init__(self, *, port: int = 0, statuses: Iterable[int] = (), secret: str | None = None) -> None:
        self.deliveries: list[Delivery] = []
        self._statuses = list(statuses)
        self._secret = secret
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = receiver._record(dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m async_inference.webhooks", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="verify one delivery; prints its payload, exit 1 when it does not verify")
    check.add_argument("--secret", required=True, help="your whsec_... signing secret")
    check.add_argument("--id", required=True, help="the webhook-id header")
    check.add_argument("--timestamp", required=True, help="the webhook-timestamp header")
    check.add_argument("--signature", required=True, help="the webhook-signature header")
    check.add_argument("body", help="a file holding the exact request body ('-' for stdin)")
    serve = commands.add_parser("receive", help="listen on 127.0.0.1 and print each delivery that verifies")
    serve.add_argument("--secret", required=True)
    serve.add_argument("--port", type=int, default=8081)
    commands.add_parser("new-secret", help="print a fresh whsec_... secret")
    args = parser.parse_args(argv)

    if args.command == "new-secret":
        print(new_secret())
        return 0
    if args.command == "verify":
        body = sys.stdin.buffer.read() if args.body == "-" else open(args.body, "rb").read()
        headers = {"webhook-id": args.id, "webhook-timestamp": args.timestamp, "webhook-signature": args.signature}
        try:
            payload = verify(args.secret, headers, body)
        except WebhookVerificationError as exc:
            print(f"NOT verified: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(payload, indent=2))
        return 0
    receiver = Receiver(port=args.port, secret=args.secret).start()
    print(f"listening on {receiver.url}; deliveries that do not verify get 401", flush=True)
    seen = 0
    try:
        while True:
            deliveries = receiver.wait_for(seen + 1, timeout_s=3600)
            for delivery in deliveries[seen:]:
                print(f"verified {delivery.headers.get('webhook-id')}: {delivery.body.decode()}", flush=True)
            seen = len(deliveries)
    except KeyboardInterrupt:
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
