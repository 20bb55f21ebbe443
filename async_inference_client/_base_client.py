"""The one implementation behind ``Client`` and ``AsyncClient``: every operation (a request and its retries, an upload,
a wait over the WebSocket or by polling) is written once here, as a generator that yields what it needs done (an
``Effect``: send this request, sleep this long, open this socket) and gets the outcome sent back.

The two clients differ only in how they carry out an effect: ``Client`` blocks, ``AsyncClient`` awaits. The shape is
openai-python's ``_base_client.py`` (one request model under ``SyncAPIClient`` and ``AsyncAPIClient``), taken one
step further so that the waits, not only the request, are shared.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx2
import websockets.exceptions
from pydantic import BaseModel, ValidationError

from async_inference_client._effects import Call, Connect, Disconnect, Flow, Receive, Send, Sleep, Transmit
from async_inference_client.errors import (
    ApiError,
    ApiUnreachable,
    BatchWaitTimeout,
    NoResult,
    SubscriptionRefused,
    UnexpectedResponse,
    WaitTimeout,
    describe,
)
from async_inference_client.limits import BATCH_ENDPOINT, MAX_FILE_INLINE_BYTES
from async_inference_client.models.batches import Batch, FileObject, FileUpload, Page
from async_inference_client.models.chat import ChatCompletion
from async_inference_client.models.embeddings import EmbeddingList
from async_inference_client.models.jobs import JobEvent, JobList, JobStatus, JobView, Subscription
from async_inference_client.retry import DEFAULT_POLL, PUSH_CHECK_S, Backoff, RetryPolicy, parse_retry_after, poll_delay
from async_inference_client.types import (
    BatchOptions,
    BatchWaitOptions,
    JobUpdate,
    ListOptions,
    OnUpdate,
    RequestBody,
    SubmitOptions,
    WaitOptions,
    Webhook,
)

ENV_API_URL = "ASYNC_INFERENCE_API_URL"
ENV_API_KEY = "ASYNC_INFERENCE_API_KEY"
ENV_WS_URL = "ASYNC_INFERENCE_WS_URL"
API_KEY_HEADER = "x-api-key"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
WS_OPEN_TIMEOUT_S = 10.0
# How long wait() waits for the API's reply to its subscription before it reads the job: the WebSocket API stores a
# subscription when its function has run, so an end that came before then would be told to nobody. A server that
# sends no reply costs this once.
WS_SUBSCRIBE_REPLY_S = 5.0

logger = logging.getLogger("async_inference_client")
_Model = TypeVar("_Model", bound=BaseModel)
# What a WebSocket that failed or closed raises: the handshake refused, the socket dropped, a bad URL, a timeout.
SOCKET_ERRORS: tuple[type[BaseException], ...] = (OSError, websockets.exceptions.WebSocketException)
SUBSCRIBE_ERRORS: tuple[type[BaseException], ...] = (*SOCKET_ERRORS, SubscriptionRefused)


# --- The operations -------------------------------------------------------------------------------------------------


class BaseClient:
    """Where the API is, its key, the retry and poll schedules, and every operation as a ``Flow``."""

    # Set by each client: how it sleeps by default, and its HTTP client class.
    _default_sleep: Callable[[float], Any]
    _http_class: Callable[..., Any]

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        ws_url: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        poll: Backoff = DEFAULT_POLL,
        push_check_s: float = PUSH_CHECK_S,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        base_url = base_url or os.environ.get(ENV_API_URL)
        api_key = api_key or os.environ.get(ENV_API_KEY)
        if not base_url:
            raise ValueError(f"no API URL: pass base_url or set {ENV_API_URL}")
        if not api_key:
            raise ValueError(f"no API key: pass api_key or set {ENV_API_KEY}")
        self.base_url = base_url.rstrip("/")
        self.ws_url = (os.environ.get(ENV_WS_URL) if ws_url is None else ws_url) or None
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self.poll = poll
        self.push_check_s = push_check_s
        self._api_key = api_key
        self._rng = rng or random.Random()
        self._clock = clock
        self._sleep = sleep or self._default_sleep
        self._http = self._http_class(timeout=timeout_s)

    # --- requests ---------------------------------------------------------------------------------------------------

    def _api(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Call:
        headers = {API_KEY_HEADER: self._api_key, **(headers or {})}
        resend_safe = method == "GET" or IDEMPOTENCY_KEY_HEADER in headers
        return Call(method, self.base_url + path, headers, json=body, params=params, resend_safe=resend_safe)

    def _send(self, call: Call) -> Flow[httpx2.Response]:
        """Send ``call`` until it succeeds, is refused for good, or is not to be sent again (RetryPolicy)."""
        attempt = 0
        while True:
            try:
                response: httpx2.Response = yield Send(call)
            except httpx2.TransportError as exc:
                delay = self.retry.delay(attempt, retry_after=None, rng=self._rng) if call.resend_safe else None
                if delay is None:
                    raise ApiUnreachable(call.url.split("?")[0], describe(exc)) from exc
                logger.info("%s %s: %s; sending again in %.2f s", call.method, call.url, describe(exc), delay)
            else:
                if response.status_code < 400:
                    return response
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                delay = None
                if response.status_code in self.retry.statuses:
                    delay = self.retry.delay(attempt, retry_after=retry_after, rng=self._rng)
                if delay is None:
                    raise ApiError(response.status_code, _body(response), retry_after=retry_after)
                logger.info(
                    "%s %s: HTTP %d; sending again in %.2f s", call.method, call.url, response.status_code, delay
                )
            yield Sleep(delay)
            attempt += 1

    def _fetch(self, call: Call, model: type[_Model]) -> Flow[_Model]:
        return _parse((yield from self._send(call)), model)

    def _put(self, url: str, headers: Mapping[str, str], data: bytes) -> Flow[httpx2.Response]:
        """A presigned PUT (no API key: the URL carries the authority)."""
        return (yield from self._send(Call("PUT", url, dict(headers), content=data, resend_safe=True)))

    # --- files and batches (the OpenAI Batch API; docs/batches.md) --------------------------------------------------

    def _upload_file(self, data: bytes, filename: str, purpose: str) -> Flow[FileObject]:
        if len(data) <= MAX_FILE_INLINE_BYTES:
            call = self._api("POST", "/v1/files")
            multipart = Call(
                call.method,
                call.url,
                call.headers,
                files={"file": (filename, data, "application/jsonl")},
                data={"purpose": purpose},
            )
            return (yield from self._fetch(multipart, FileObject))
        body = {"filename": filename, "purpose": purpose, "bytes": len(data)}
        created = yield from self._fetch(self._api("POST", "/v1/files/uploads", body=body), FileUpload)
        yield from self._put(created.upload.url, created.upload.headers, data)
        return (yield from self._fetch(self._api("GET", f"/v1/files/{created.id}"), FileObject))

    def _file_content(self, file_id: str) -> Flow[bytes]:
        response = yield from self._send(self._api("GET", f"/v1/files/{file_id}/content"))
        location = response.headers.get("location")
        if response.status_code not in (301, 302, 303, 307, 308) or not location:
            return response.content
        # A presigned GET, fetched without the key.
        return (yield from self._send(Call("GET", location, {}, resend_safe=True))).content

    def _create_batch(self, input_file_id: str, options: BatchOptions) -> Flow[Batch]:
        body: dict[str, Any] = {
            "input_file_id": input_file_id,
            "endpoint": BATCH_ENDPOINT,
            "completion_window": options.get("completion_window", "24h"),
        }
        if options.get("metadata"):
            body["metadata"] = dict(options["metadata"])
        if options.get("webhook"):
            body["webhook"] = _webhook(options["webhook"])
        return (yield from self._fetch(self._api("POST", "/v1/batches", body=body), Batch))

    def _get_batch(self, batch_id: str) -> Flow[Batch]:
        return (yield from self._fetch(self._api("GET", f"/v1/batches/{batch_id}"), Batch))

    def _list_batches(self, after: str | None, limit: int | None) -> Flow[Page[Batch]]:
        params = _present(after=after, limit=limit)
        return (yield from self._fetch(self._api("GET", "/v1/batches", params=params), Page[Batch]))

    def _cancel_batch(self, batch_id: str) -> Flow[Batch]:
        return (yield from self._fetch(self._api("POST", f"/v1/batches/{batch_id}/cancel"), Batch))

    def _wait_batch(self, batch_id: str, options: BatchWaitOptions) -> Flow[Batch]:
        timeout_s, on_update = options.get("timeout_s", 24 * 3600.0), options.get("on_update")
        poll = options.get("poll") or self.poll
        deadline = self._clock() + timeout_s
        attempt = 0
        while True:
            batch = yield from self._get_batch(batch_id)
            if on_update:
                on_update(batch)
            if batch.status.is_final:
                return batch
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise BatchWaitTimeout(batch, timeout_s)
            yield Sleep(min(remaining, poll_delay(poll, attempt, retry_after=None, rng=self._rng)))
            attempt += 1

    # --- jobs -------------------------------------------------------------------------------------------------------

    def _submit(self, options: SubmitOptions, **source: Any) -> Flow[JobView]:
        """``POST /v1/jobs``: ``source`` is ``request=`` (inline) or ``upload=`` (presigned)."""
        sent_as_is = {name: value for name, value in options.items() if name not in ("idempotency_key", "webhook")}
        body: dict[str, Any] = {name: value for name, value in sent_as_is.items() if value is not None}
        body["metadata"] = dict(options.get("metadata") or {})
        body.update(source)
        if options.get("webhook"):
            body["webhook"] = _webhook(options["webhook"])
        key = options.get("idempotency_key")
        headers = {IDEMPOTENCY_KEY_HEADER: key} if key else {}
        return (yield from self._fetch(self._api("POST", "/v1/jobs", body=body, headers=headers), JobView))

    def _submit_inline(self, request: RequestBody, options: SubmitOptions) -> Flow[JobView]:
        return (yield from self._submit(options, request=_plain(request)))

    def _submit_upload(self, request_body: bytes | RequestBody, options: SubmitOptions) -> Flow[JobView]:
        data = _request_bytes(request_body)
        job = yield from self._submit(options, upload={"size_bytes": len(data)})
        if job.upload is not None:  # None: an idempotent retry of a job whose upload went through
            yield from self._put(job.upload.url, job.upload.headers, data)
        return job

    def _get(self, job_id: str) -> Flow[JobView]:
        return (yield from self._fetch(self._api("GET", f"/v1/jobs/{job_id}"), JobView))

    def _list(self, options: ListOptions) -> Flow[JobList]:
        status = options.get("status")
        params = _present(
            status=status.value if isinstance(status, JobStatus) else status,
            limit=options.get("limit"),
            next=options.get("next_token"),
        )
        return (yield from self._fetch(self._api("GET", "/v1/jobs", params=params), JobList))

    def _cancel(self, job_id: str) -> Flow[JobView]:
        return (yield from self._fetch(self._api("POST", f"/v1/jobs/{job_id}/cancel"), JobView))

    def _result(self, job: JobView | str) -> Flow[ChatCompletion]:
        return (yield from self._result_as(job, ChatCompletion))

    def _embeddings(self, job: JobView | str) -> Flow[EmbeddingList]:
        return (yield from self._result_as(job, EmbeddingList))

    def _result_as(self, job: JobView | str, model: type[_Model]) -> Flow[_Model]:
        view = (yield from self._get(job)) if isinstance(job, str) else job
        if view.result is not None and view.result.expires_at <= dt.datetime.now(dt.UTC):
            view = yield from self._get(view.job_id)  # a fresh presigned URL
        if view.status is not JobStatus.SUCCEEDED or view.result is None:
            raise NoResult(
                f"job {view.job_id} is {view.status.value}, it has no result"
                + (f": {view.error}" if view.error else "")
            )
        return (yield from self._fetch(Call("GET", view.result.url, {}, resend_safe=True), model))

    # --- waiting ----------------------------------------------------------------------------------------------------

    def _wait(self, job_id: str, options: WaitOptions) -> Flow[JobView]:
        timeout_s = options.get("timeout_s", 600.0)
        deadline = self._clock() + timeout_s
        notify = options.get("on_update") or (lambda update: None)
        if self.ws_url:
            job = yield from self._wait_pushed(job_id, deadline, timeout_s, notify)
            if job is not None:
                return job
        return (yield from self._wait_polled(job_id, deadline, timeout_s, notify, options.get("poll") or self.poll))

    def _read_job(self, job_id: str, notify: OnUpdate) -> Flow[tuple[JobView, float | None]]:
        """The job's view (told to ``notify``) and the Retry-After its GET answered with."""
        response = yield from self._send(self._api("GET", f"/v1/jobs/{job_id}"))
        job = _parse(response, JobView)
        notify(JobUpdate.of_view(job))
        return job, parse_retry_after(response.headers.get("retry-after"))

    def _wait_polled(
        self, job_id: str, deadline: float, timeout_s: float, notify: OnUpdate, schedule: Backoff
    ) -> Flow[JobView]:
        attempt = 0
        while True:
            job, retry_after = yield from self._read_job(job_id, notify)
            if job.status.is_final:
                return job
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise WaitTimeout(job, timeout_s)
            yield Sleep(min(remaining, poll_delay(schedule, attempt, retry_after=retry_after, rng=self._rng)))
            attempt += 1

    def _wait_pushed(self, job_id: str, deadline: float, timeout_s: float, notify: OnUpdate) -> Flow[JobView | None]:
        """Follow the job over the WebSocket until it is final; None when the socket failed or closed first."""
        assert self.ws_url is not None
        options = {
            "additional_headers": {API_KEY_HEADER: self._api_key},
            "open_timeout": max(0.1, min(WS_OPEN_TIMEOUT_S, deadline - self._clock())),
        }
        try:
            socket = yield Connect(self.ws_url, options)
        except SOCKET_ERRORS as exc:
            logger.warning("WebSocket %s: %s; polling instead", self.ws_url, describe(exc))
            return None
        try:
            try:
                yield Transmit(socket, Subscription(job_ids=[job_id]).model_dump_json(exclude_none=True))
                yield from self._until_subscribed(socket, deadline)
            except SUBSCRIBE_ERRORS as exc:
                logger.warning("WebSocket %s: %s; polling instead", self.ws_url, describe(exc))
                return None
            # Read once subscribed: an end that came before the subscription is seen here rather than missed.
            job, _ = yield from self._read_job(job_id, notify)
            while not job.status.is_final:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise WaitTimeout(job, timeout_s)
                try:
                    raw = yield Receive(socket, min(remaining, self.push_check_s))
                except TimeoutError:  # a quiet socket: check that no push was lost
                    job, _ = yield from self._read_job(job_id, notify)
                    continue
                except SOCKET_ERRORS as exc:
                    logger.warning("WebSocket %s closed (%s); polling instead", self.ws_url, describe(exc))
                    return None
                event = _event_for(raw, job_id)
                if event is None:
                    continue
                notify(JobUpdate.of_event(event))
                if event.status.is_final:
                    job, _ = yield from self._read_job(job_id, notify)  # the final view: result URL, usage, error
            return job
        finally:
            yield Disconnect(socket)

    def _until_subscribed(self, socket: Any, deadline: float) -> Flow[None]:
        """Wait for the API's reply to the subscription (at most WS_SUBSCRIBE_REPLY_S); what comes before it is older
        than the GET that follows, and is dropped."""
        # The socket's own timeouts are real time, whatever clock the client was given.
        ends = time.monotonic() + min(WS_SUBSCRIBE_REPLY_S, max(0.0, deadline - self._clock()))
        while (left := ends - time.monotonic()) > 0:
            try:
                if _subscription_reply((yield Receive(socket, left))):
                    return
            except TimeoutError:
                return


# --- Bodies and answers ---------------------------------------------------------------------------------------------


def _parse(response: httpx2.Response, model: type[_Model]) -> _Model:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(body)"
        raise UnexpectedResponse(
            f"HTTP {response.status_code} from {response.request.url.copy_with(query=None)} is not a "
            f"{model.__name__}: {where}: {first['msg']}"
        ) from exc


def _body(response: httpx2.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _present(**params: Any) -> dict[str, Any]:
    return {name: value for name, value in params.items() if value is not None}


def _plain(value: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return dict(value)


def _webhook(webhook: Webhook) -> dict[str, Any]:
    return {"url": webhook} if isinstance(webhook, str) else _plain(webhook)


def _request_bytes(request_body: bytes | RequestBody) -> bytes:
    if isinstance(request_body, bytes):
        return request_body
    if isinstance(request_body, BaseModel):
        return request_body.model_dump_json(exclude_unset=True).encode()
    return json.dumps(dict(request_body)).encode()


def _subscription_reply(raw: str | bytes) -> bool:
    """True for the API's "subscribed" reply; SubscriptionRefused for its "error" reply; False for anything else (an
    event, a message this client does not know)."""
    try:
        reply = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(reply, dict):
        return False
    if reply.get("type") == "error":
        raise SubscriptionRefused(f"{reply.get('code')}: {reply.get('message')}")
    return reply.get("type") == "subscribed"


def _event_for(raw: str | bytes, job_id: str) -> JobEvent | None:
    """The message as an event about ``job_id``; None for anything else (another job, an acknowledgement, a message
    this client does not know)."""
    try:
        event = JobEvent.model_validate_json(raw)
    except ValidationError:
        logger.debug("WebSocket message ignored: %.200r", raw)
        return None
    return event if event.job_id == job_id else None
