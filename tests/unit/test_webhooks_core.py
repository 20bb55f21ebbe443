"""Webhook URL checks, signing, backoff, delivery and the dispatcher's decisions, without AWS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from async_inference import settings
from async_inference.config import DispatcherSettings, SettingsError
from async_inference.jobs import JobStatus
from async_inference.schemas import Job, ResultNotification, Timings, WebhookAttempt, WebhookState, utcnow
from async_inference.webhooks import delivery, events, signing, url_safety
from async_inference.webhooks.__main__ import main as webhooks_main
from async_inference.webhooks.backoff import Backoff
from async_inference.webhooks.delivery import PostResult
from async_inference.webhooks.dispatch import Dispatcher
from async_inference.webhooks.secrets import TenantSecrets
from async_inference.webhooks.url_safety import UnsafeUrl, check_url

PUBLIC = "93.184.216.34"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def resolver_to(*addresses: str):
    return lambda host, port: list(addresses)


# --- URL checks -----------------------------------------------------------------------------------------------------


def test_https_url_resolving_to_public_addresses_is_accepted_with_its_addresses():
    target = check_url("https://hooks.example.com:8443/in?x=1", resolver=resolver_to(PUBLIC, "2606:2800:220:1::1"))
    assert (target.scheme, target.host, target.port, target.path) == ("https", "hooks.example.com", 8443, "/in?x=1")
    assert target.addresses == (PUBLIC, "2606:2800:220:1::1")
    assert target.host_header == "hooks.example.com:8443"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("169.254.169.254", "metadata"),
        ("169.254.170.2", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "not a public"),  # carrier-grade NAT
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("0.0.0.0", "not a unicast"),
        ("224.0.1.1", "not a unicast"),
        ("::ffff:169.254.169.254", "metadata"),  # IPv4-mapped
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("2002:a9fe:a9fe::1", "metadata"),  # 6to4 of 169.254.169.254
    ],
)
def test_internal_addresses_are_refused(address: str, reason: str):
    with pytest.raises(UnsafeUrl, match=reason):
        check_url("https://innocent.example.com/", resolver=resolver_to(address))


def test_every_resolved_address_is_checked_not_just_the_first():
    # GIVEN a host with one public and one private address (a resolver may hand either to the connection)
    with pytest.raises(UnsafeUrl, match="10.0.0.1 is a private address"):
        check_url("https://mixed.example.com/", resolver=resolver_to(PUBLIC, "10.0.0.1"))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/", "https://"),
        ("ftp://hooks.example.com/", "https://"),
        ("https://user:secret@hooks.example.com/", "credentials"),
        ("https:///path-only", "no host"),
        ("https://hooks.example.com/a b", "whitespace"),
        ("https://hooks.example.com:99999/", "not valid"),
        ("https://hooks.example.com/" + "a" * url_safety.MAX_URL_CHARS, "longer than"),
    ],
)
def test_malformed_or_non_https_urls_are_refused(url: str, reason: str):
    with pytest.raises(UnsafeUrl, match=reason):
        check_url(url, resolver=resolver_to(PUBLIC))


def test_a_host_that_does_not_resolve_is_refused():
    with pytest.raises(UnsafeUrl, match="does not resolve"):
        check_url("https://no-such-host.invalid/")


def test_locally_http_and_loopback_are_allowed_but_only_for_loopback():
    assert check_url("http://127.0.0.1:9000/h", allow_local=True).addresses == ("127.0.0.1",)
    with pytest.raises(UnsafeUrl, match="https://"):
        check_url("http://hooks.example.com/", allow_local=True, resolver=resolver_to(PUBLIC))
    with pytest.raises(UnsafeUrl, match="private"):
        check_url("https://10.0.0.1/", allow_local=True, resolver=resolver_to("10.0.0.1"))
    with pytest.raises(UnsafeUrl, match="metadata"):
        check_url("http://169.254.169.254/", allow_local=True)


# --- Signing --------------------------------------------------------------------------------------------------------


def test_signed_headers_verify_with_standardwebhooks_and_a_changed_body_does_not():
    body = json.dumps({"job_id": "job_1"})
    headers = signing.signed_headers([SECRET], "job_1_completed", body)
    assert Webhook(SECRET).verify(body, headers) == {"job_id": "job_1"}
    assert set(headers) >= {"webhook-id", "webhook-timestamp", "webhook-signature"}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace("1", "2"), headers)


def test_during_a_rotation_both_secrets_sign_and_either_verifies():
    new = signing.new_secret()
    headers = signing.signed_headers([new, SECRET], "id", "{}")
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(new).verify("{}", headers)
    Webhook(SECRET).verify("{}", headers)


def test_new_secret_has_the_whsec_prefix_and_32_random_bytes():
    a, b = signing.new_secret(), signing.new_secret()
    assert a.startswith("whsec_") and a != b
    Webhook(a)  # parses as a Standard Webhooks secret


DISPATCHER_ENV = {"JOBS_TABLE_NAME": "jobs", "WEBHOOK_QUEUE_URLS": '{"t1": "http://sqs/webhooks-t1"}'}


@pytest.fixture
def dispatcher_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name, value in DISPATCHER_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("WEBHOOK_SECRETS_JSON", "WEBHOOK_SECRET_ARNS", "WEBHOOK_BACKOFF_BASE_S", "WEBHOOK_BACKOFF_MAX_S"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_secrets_come_from_inline_json_locally(dispatcher_env: pytest.MonkeyPatch):
    dispatcher_env.setenv("WEBHOOK_SECRETS_JSON", json.dumps({"t1": SECRET, "t2": ["whsec_bmV3", "whsec_b2xk"]}))
    secrets = TenantSecrets.from_settings(DispatcherSettings.load())
    assert secrets.for_tenant("t1") == [SECRET]
    assert secrets.for_tenant("t2") == ["whsec_bmV3", "whsec_b2xk"]
    with pytest.raises(KeyError):
        secrets.for_tenant("t3")


def test_each_tenants_secret_comes_from_its_own_secret_through_powertools_with_caching(
    dispatcher_env: pytest.MonkeyPatch,
):
    # GIVEN each tenant's secret ARN, as the stack sets WEBHOOK_SECRET_ARNS, and the values Secrets Manager holds: a
    # value the deploy generated (no prefix), and one an operator rotated (a JSON list, newest first)
    monkeypatch = dispatcher_env
    calls = []
    stored = {"arn:t1": SECRET.removeprefix("whsec_"), "arn:t2": '["whsec_bmV3", "whsec_b2xk"]'}

    def get_secret(name: str, **kwargs: Any) -> str:
        calls.append((name, kwargs))
        return stored[name]

    from aws_lambda_powertools.utilities import parameters

    monkeypatch.setenv("WEBHOOK_SECRET_ARNS", json.dumps({"t1": "arn:t1", "t2": "arn:t2"}))
    monkeypatch.setattr(parameters, "get_secret", get_secret)
    secrets = TenantSecrets.from_settings(DispatcherSettings.load())
    # WHEN the dispatcher asks for them THEN each is a whsec_ secret, newest first, read from its tenant's secret
    assert secrets.for_tenant("t1") == [SECRET]
    assert secrets.for_tenant("t2") == ["whsec_bmV3", "whsec_b2xk"]
    assert calls == [("arn:t1", {"max_age": 300}), ("arn:t2", {"max_age": 300})]
    # AND a tenant the stack made no secret for has none
    with pytest.raises(KeyError, match="t3"):
        secrets.for_tenant("t3")


def test_missing_secret_configuration_fails_at_start_naming_the_variables(dispatcher_env: pytest.MonkeyPatch):
    with pytest.raises(SettingsError, match="set WEBHOOK_SECRET_ARNS \\(or WEBHOOK_SECRETS_JSON in tests\\)"):
        DispatcherSettings.load()


def test_malformed_inline_secrets_fail_at_start_without_showing_them(dispatcher_env: pytest.MonkeyPatch):
    # GIVEN inline secrets that are not JSON
    dispatcher_env.setenv("WEBHOOK_SECRETS_JSON", f'{{"t1": "{SECRET}"')
    # WHEN the dispatcher reads its settings THEN the error names the variable and leaves the secret out
    with pytest.raises(SettingsError, match="WEBHOOK_SECRETS_JSON: Invalid JSON") as raised:
        DispatcherSettings.load()
    assert SECRET not in str(raised.value)


# --- Backoff --------------------------------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base_up_to_the_max():
    backoff = Backoff(base_s=30, max_s=900)
    assert [backoff.delay_s(n, rand=lambda: 0.0) for n in range(1, 8)] == [30, 60, 120, 240, 480, 900, 900]


def test_jitter_adds_at_most_ten_percent_and_never_shortens_the_schedule():
    backoff = Backoff(base_s=30, max_s=900)
    assert backoff.delay_s(2, rand=lambda: 0.999) == 66
    assert backoff.delay_s(10_000, rand=lambda: 1.0) == 990


def test_retries_with_the_shared_settings_span_more_than_an_hour_before_the_dlq():
    # The receives before the last each wait a backoff; the last one's failure sends the message to the DLQ.
    span = sum(Backoff().delay_s(n, rand=lambda: 0.0) for n in range(1, settings.WEBHOOK_MAX_RECEIVE_COUNT))
    assert span == settings.webhook_retry_span_s() >= 3600


def test_backoff_is_overridable_by_env_for_local_runs(dispatcher_env: pytest.MonkeyPatch):
    dispatcher_env.setenv("WEBHOOK_SECRETS_JSON", "{}")
    dispatcher_env.setenv("WEBHOOK_BACKOFF_BASE_S", "0")
    dispatcher_env.setenv("WEBHOOK_BACKOFF_MAX_S", "1")
    assert Backoff.from_settings(DispatcherSettings.load()) == Backoff(base_s=0, max_s=1)


def test_a_malformed_backoff_fails_at_start_naming_the_variable(dispatcher_env: pytest.MonkeyPatch):
    dispatcher_env.setenv("WEBHOOK_SECRETS_JSON", "{}")
    dispatcher_env.setenv("WEBHOOK_BACKOFF_BASE_S", "soon")
    with pytest.raises(SettingsError, match="WEBHOOK_BACKOFF_BASE_S='soon'"):
        DispatcherSettings.load()


# --- Queue messages -------------------------------------------------------------------------------------------------


def make_job(
    *, events: list[str] | None = ("completed",), url: str = "https://hooks.example.com/in", **fields: Any
) -> Job:
    now = utcnow()
    values: dict[str, Any] = dict(
        job_id="job_" + "a" * 32,
        tenant="t1",
        status=JobStatus.SUCCEEDED,
        created_at=now,
        updated_at=now,
        started_at=now,
        request_bucket="b",
        request_key="k",
        deadline=now + dt.timedelta(hours=1),
        timeout_s=60,
        attempts=1,
        webhook=WebhookState(url=url, events=list(events)) if events is not None else None,
    )
    values.update(fields)
    return Job(**values)


def notification_body(job: Job) -> str:
    return ResultNotification(
        job_id=job.job_id, tenant=job.tenant, status=job.status, timings=Timings(created_at=job.created_at)
    ).model_dump_json(exclude_none=True)


def test_queued_messages_are_recognised_raw_inside_an_sns_envelope_and_as_started_events():
    job = make_job()
    raw = notification_body(job)
    assert events.parse_queued(raw) == events.QueuedEvent("completed", job.job_id, raw)
    envelope = json.dumps({"Type": "Notification", "Message": raw, "TopicArn": "arn"})
    assert events.parse_queued(envelope) == events.QueuedEvent("completed", job.job_id, raw)
    started = events.JobStartedEvent.of(make_job(status=JobStatus.RUNNING)).model_dump_json()
    assert events.parse_queued(started).kind == "started"
    assert events.parse_queued("not json") is None
    assert events.parse_queued(json.dumps({"job_id": "x"})) is None


class FakeQueue:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []  # (tenant, body)
        self.fail = fail

    def send(self, tenant: str, body: str) -> None:
        if self.fail:
            raise ConnectionError("sqs down")
        self.sent.append((tenant, body))


def test_started_event_is_queued_only_for_jobs_that_asked_for_it():
    queue = FakeQueue()
    assert events.started_event(make_job(events=["completed"]), queue=queue) is False
    assert events.started_event(make_job(events=None), queue=queue) is False
    assert queue.sent == []
    job = make_job(events=["started", "completed"], status=JobStatus.RUNNING)
    assert events.started_event(job, queue=queue) is True
    [(tenant, body)] = queue.sent
    assert tenant == job.tenant  # to its tenant's queue
    event = events.JobStartedEvent.model_validate_json(body)
    assert (event.event, event.job_id, event.status, event.attempt) == ("job.started", job.job_id, JobStatus.RUNNING, 1)


def test_started_event_never_raises_so_the_job_still_runs():
    assert events.started_event(make_job(events=["started"]), queue=FakeQueue(fail=True)) is False


# --- The dispatcher -------------------------------------------------------------------------------------------------


class FakeStore:
    def __init__(self, job: Job | None) -> None:
        self.job = job
        self.attempts: list[tuple[dict[str, Any], str | None]] = []

    def get(self, job_id: str) -> Job | None:
        return self.job

    def record_webhook_attempt(self, job_id: str, attempt: dict[str, Any], *, status: str | None = None) -> bool:
        self.attempts.append((attempt, status))
        return True


class FakePoster:
    def __init__(self, *results: PostResult) -> None:
        self.results = list(results)
        self.calls: list[tuple[url_safety.Target, dict[str, str], bytes]] = []

    def __call__(self, target: url_safety.Target, headers: dict[str, str], body: bytes) -> PostResult:
        self.calls.append((target, headers, body))
        return self.results.pop(0)


def dispatcher(store: FakeStore, poster: FakePoster, *, resolver=resolver_to(PUBLIC), secrets=None) -> Dispatcher:  # noqa: B008
    return Dispatcher(
        store=store,
        secrets=secrets or TenantSecrets({"t1": SECRET}.get),
        backoff=Backoff(base_s=30, max_s=900),
        resolver=resolver,
        poster=poster,
    )


def test_a_2xx_answer_is_recorded_as_delivered_and_the_message_is_done():
    job = make_job()
    store, poster = FakeStore(job), FakePoster(PostResult(204))
    body = notification_body(job)
    outcome = dispatcher(store, poster).dispatch(body, receive_count=1)
    assert outcome.done and outcome.reason == "delivered"
    [(target, headers, sent)] = poster.calls
    assert target.addresses == (PUBLIC,) and sent == body.encode()
    assert Webhook(SECRET).verify(sent, headers)["job_id"] == job.job_id
    [(attempt, status)] = store.attempts
    assert status == "delivered" and attempt["status_code"] == 204 and attempt["event"] == "completed"


@pytest.mark.parametrize("code", [301, 302, 400, 500, 503])
def test_any_other_answer_redirects_included_is_a_failed_attempt_retried_after_the_backoff(code: int):
    store, poster = FakeStore(make_job()), FakePoster(PostResult(code))
    outcome = dispatcher(store, poster).dispatch(notification_body(store.job), receive_count=3)
    assert not outcome.done and 120 <= outcome.retry_in_s <= 132
    [(attempt, status)] = store.attempts
    assert status is None and attempt == {**attempt, "status_code": code, "error": f"HTTP {code}"}


def test_the_last_receive_marks_the_webhook_failed_and_does_not_hide_the_message():
    store, poster = FakeStore(make_job()), FakePoster(PostResult(None, error="ConnectTimeoutError: slow"))
    outcome = dispatcher(store, poster).dispatch(notification_body(store.job), settings.WEBHOOK_MAX_RECEIVE_COUNT)
    assert not outcome.done and outcome.retry_in_s == 0
    [(attempt, status)] = store.attempts
    assert status == "failed" and attempt["error"] == "ConnectTimeoutError: slow" and "status_code" not in attempt


def test_a_host_that_rebinds_to_a_metadata_address_is_refused_at_delivery_without_a_request():
    # GIVEN a URL that was public at submit time but now resolves to the metadata service
    store, poster = FakeStore(make_job()), FakePoster()
    outcome = dispatcher(store, poster, resolver=resolver_to("169.254.169.254")).dispatch(
        notification_body(store.job), receive_count=1
    )
    # THEN nothing is sent, and the attempt says why
    assert poster.calls == [] and not outcome.done
    assert "refused" in store.attempts[0][0]["error"] and "metadata" in store.attempts[0][0]["error"]


@pytest.mark.parametrize(
    "job",
    [
        make_job(events=None),
        make_job(events=["started"]),
        make_job(webhook=WebhookState(url="https://hooks.example.com/in", events=["completed"], status="delivered")),
    ],
    ids=["no webhook", "not subscribed to completed", "delivered already"],
)
def test_events_with_nothing_to_deliver_are_done_without_a_request(job: Job):
    store, poster = FakeStore(job), FakePoster()
    assert dispatcher(store, poster).dispatch(notification_body(job), receive_count=1).done
    assert poster.calls == [] and store.attempts == []


def test_a_started_delivery_does_not_decide_the_status_when_completed_is_also_wanted():
    job = make_job(events=["started", "completed"], status=JobStatus.RUNNING)
    store, poster = FakeStore(job), FakePoster(PostResult(200))
    body = events.JobStartedEvent.of(job).model_dump_json()
    assert dispatcher(store, poster).dispatch(body, receive_count=1).done
    [(attempt, status)] = store.attempts
    assert status is None and attempt["event"] == "started"
    assert poster.calls[0][1]["webhook-id"] == f"{job.job_id}_started"


def test_a_tenant_without_a_secret_is_a_failed_attempt_not_an_unsigned_request():
    store, poster = FakeStore(make_job(tenant="nobody")), FakePoster()
    outcome = dispatcher(store, poster).dispatch(notification_body(store.job), receive_count=1)
    assert not outcome.done and poster.calls == []
    assert store.attempts[0][0]["error"] == "the service has no signing secret for this tenant"


def test_the_attempt_recorded_is_what_the_webhook_attempt_model_reads_back_nothing_lost():
    # GIVEN a receiver that answers 503 on the third receive of the delivery
    store, poster = FakeStore(make_job()), FakePoster(PostResult(503))
    # WHEN the dispatcher records the attempt
    dispatcher(store, poster).dispatch(notification_body(store.job), receive_count=3)
    [(attempt, _)] = store.attempts
    # THEN the record is the model's own form: a reader (JobView.webhook.attempts) gets every field written
    read = WebhookAttempt.model_validate(attempt)
    assert read.model_dump(mode="json", exclude_none=True) == attempt
    assert (read.event, read.receive_count, read.status_code, read.error) == ("completed", 3, 503, "HTTP 503")


# --- The HTTP POST itself -------------------------------------------------------------------------------------------


class _Server:
    def __init__(self, status: int, tls: ssl.SSLContext | None = None) -> None:
        self.hits: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.hits.append(dict(self.headers.items()))
                self.send_response(status)
                if status in (301, 302):
                    self.send_header("Location", "http://169.254.169.254/")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def local_target(port: int, *, scheme: str = "http", host: str = "127.0.0.1") -> url_safety.Target:
    return url_safety.Target(url="", scheme=scheme, host=host, port=port, path="/in", addresses=("127.0.0.1",))  # type: ignore[arg-type]


def test_a_redirect_is_not_followed():
    server = _Server(302)
    try:
        result = delivery.post(local_target(server.port), {"content-type": "application/json"}, b"{}")
    finally:
        server.close()
    assert result == PostResult(302) and not result.delivered and len(server.hits) == 1


def test_a_refused_connection_is_a_failed_attempt_with_the_error():
    server = _Server(200)
    server.close()
    result = delivery.post(local_target(server.port), {}, b"{}")
    assert result.status_code is None and result.error and not result.delivered


@pytest.fixture(scope="module")
def tls_certificate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A self-signed certificate for hooks.example.test, so the pinned-address HTTPS path can be checked locally."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hooks.example.test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("hooks.example.test")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory = tmp_path_factory.mktemp("tls")
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    yield directory


def _tls_server(certs: Path) -> _Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / "cert.pem", certs / "key.pem")
    return _Server(200, tls=context)


def test_https_connects_to_the_checked_address_and_verifies_the_certificate_for_the_host_name(tls_certificate: Path):
    server = _tls_server(tls_certificate)
    try:
        target = local_target(server.port, scheme="https", host="hooks.example.test")
        result = delivery.post(target, {}, b"{}", ca_certs=str(tls_certificate / "cert.pem"))
        wrong_name = delivery.post(
            local_target(server.port, scheme="https", host="other.example.test"),
            {},
            b"{}",
            ca_certs=str(tls_certificate / "cert.pem"),
        )
    finally:
        server.close()
    assert result == PostResult(200)
    assert server.hits[0]["Host"] == f"hooks.example.test:{server.port}"
    assert wrong_name.status_code is None and "doesn't match" in (wrong_name.error or "")
    assert len(server.hits) == 1


def test_an_untrusted_certificate_is_a_failed_attempt(tls_certificate: Path):
    server = _tls_server(tls_certificate)
    try:
        result = delivery.post(local_target(server.port, scheme="https", host="hooks.example.test"), {}, b"{}")
    finally:
        server.close()
    assert result.status_code is None and server.hits == []


# --- The receiving side's CLI ---------------------------------------------------------------------------------------


def test_cli_verify_accepts_a_genuine_delivery_and_rejects_a_tampered_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    body = json.dumps({"job_id": "job_1", "status": "succeeded"})
    headers = signing.signed_headers([SECRET], "job_1_completed", body)
    args = [
        "--secret",
        SECRET,
        "--id",
        headers["webhook-id"],
        "--timestamp",
        headers["webhook-timestamp"],
        "--signature",
        headers["webhook-signature"],
    ]
    (tmp_path / "good.json").write_text(body)
    (tmp_path / "bad.json").write_text(body.replace("succeeded", "failed"))
    assert webhooks_main(["verify", *args, str(tmp_path / "good.json")]) == 0
    assert json.loads(capsys.readouterr().out) == {"job_id": "job_1", "status": "succeeded"}
    assert webhooks_main(["verify", *args, str(tmp_path / "bad.json")]) == 1


def test_cli_receive_saves_each_delivery_and_prints_the_verify_command_that_checks_it(tmp_path: Path):
    # GIVEN the documented local receiver, listening with a tenant's secret and saving what it gets
    import shlex
    import subprocess
    import sys
    import urllib.request

    from local_runtime.moto_server import free_port

    port = free_port()
    receiver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "async_inference.webhooks",
            "receive",
            "--secret",
            SECRET,
            "--port",
            str(port),
            "--save-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in receiver.stdout.readline()
        # WHEN a signed delivery arrives
        body = json.dumps({"job_id": "job_1", "status": "succeeded"})
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/hook",
            data=body.encode(),
            method="POST",
            headers=signing.signed_headers([SECRET], "job_1_completed", body),
        )
        assert urllib.request.urlopen(request, timeout=10).status == 200
        assert receiver.stdout.readline().startswith("verified job_1_completed")
        command = receiver.stdout.readline().split(": ", 1)[1]
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
    # THEN the printed command, run as printed, verifies the saved body
    checked = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout) == {"job_id": "job_1", "status": "succeeded"}


def test_refusal_reasons_cover_every_non_global_ipv4_special_range():
    # Every IPv4 special-purpose range the standard library knows as non-global is refused.
    for network in [
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "240.0.0.0/4",
        "255.255.255.255/32",
    ]:
        address = str(next(iter(ipaddress.ip_network(network).hosts()), ipaddress.ip_network(network).network_address))
        assert url_safety.refusal(address) is not None, network


class _DrippingServer:
    """A receiver that answers a POST with one header line every ``every_s``, never finishing its headers sooner."""

    def __init__(self, lines: int, every_s: float) -> None:
        import socket
        import time

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

        def serve() -> None:
            connection, _ = self.listener.accept()
            with connection:
                connection.recv(65536)
                try:
                    connection.sendall(b"HTTP/1.1 200 OK\r\n")
                    for i in range(lines):
                        time.sleep(every_s)
                        connection.sendall(f"X-Drip-{i}: 1\r\n".encode())
                    connection.sendall(b"Content-Length: 0\r\n\r\n")
                except OSError:  # the client went away
                    pass

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def test_a_receiver_dripping_its_headers_is_cut_at_the_deadline_in_wall_time():
    import time

    # GIVEN a receiver that sends one header line every 0.3 s for 4 s: no single read ever waits the 1 s timeout
    server = _DrippingServer(lines=13, every_s=0.3)
    try:
        # WHEN a delivery with a 1 s deadline is made to it
        started = time.monotonic()
        result = delivery.post(local_target(server.port), {}, b"{}", deadline_s=1.0)
        took = time.monotonic() - started
    finally:
        server.close()

    # THEN it ends at the deadline, a failed attempt that says why
    assert took < 2.0
    assert not result.delivered and result.error == "no response status within 1 s"


def test_a_receiver_that_held_a_delivery_to_the_deadline_is_not_attempted_again_while_paused_others_are():
    # GIVEN a dispatcher whose first delivery, to tenant t1's receiver, used its whole deadline
    slow_job = make_job(url="https://slow.example.com/in")
    other_job = make_job(url="https://fast.example.com/in", job_id="job_" + "b" * 32, tenant="t2")
    store = FakeStore(slow_job)
    poster = FakePoster(PostResult(None, "no response status within 5 s", timed_out=True), PostResult(204))
    d = dispatcher(store, poster, secrets=TenantSecrets({"t1": SECRET, "t2": SECRET}.get))
    d.dispatch(notification_body(slow_job), receive_count=1)

    # WHEN another event for that receiver comes, then one for another tenant's receiver
    again = d.dispatch(notification_body(slow_job), receive_count=1)
    store.job = other_job
    other = d.dispatch(notification_body(other_job), receive_count=1)

    # THEN the slow receiver is not attempted (a failed attempt, retried after the backoff), the other one is
    assert [call[0].host for call in poster.calls] == ["slow.example.com", "fast.example.com"]
    assert not again.done and again.retry_in_s >= 30 and "not attempted" in again.reason
    assert other.done and other.reason == "delivered"


def test_a_tenant_whose_receiver_held_a_delivery_to_the_deadline_has_its_other_receivers_paused_not_other_tenants():
    # GIVEN a dispatcher whose first delivery, to one of tenant t1's receivers, used its whole deadline
    jobs = [
        make_job(url="https://slow-1.example.com/in"),
        make_job(url="https://slow-2.example.com/in", job_id="job_" + "b" * 32),
        make_job(url="https://fast.example.com/in", job_id="job_" + "c" * 32, tenant="t2"),
    ]
    store = FakeStore(jobs[0])
    poster = FakePoster(PostResult(None, "no response status within 5 s", timed_out=True), PostResult(204))
    d = dispatcher(store, poster, secrets=TenantSecrets({"t1": SECRET, "t2": SECRET}.get))
    d.dispatch(notification_body(jobs[0]), receive_count=1)

    # WHEN t1's next event names another receiver (a new host, as a tenant may for each event), then t2's comes
    outcomes = []
    for job in jobs[1:]:
        store.job = job
        outcomes.append(d.dispatch(notification_body(job), receive_count=1))

    # THEN t1's other receiver is not attempted (it would hold the batch, and t2's behind it, for another deadline);
    # t2's is delivered
    assert [call[0].host for call in poster.calls] == ["slow-1.example.com", "fast.example.com"]
    assert not outcomes[0].done and "another receiver of this tenant" in outcomes[0].reason
    assert outcomes[1].done and outcomes[1].reason == "delivered"
