"""The Python SDK for the HTTP API (v1): ``Client`` (blocking) and ``AsyncClient`` (asyncio), with the same methods.

Results are the wire models of ``async_inference.schemas``: ``JobView``, ``JobList``, ``ChatCompletion``. A request
the API refuses with 429 or 503 is sent again after the server's ``Retry-After``, or after an exponential backoff with
jitter (``async_inference.retry``). ``wait()`` follows a job over the WebSocket API when it knows that API's URL
(``ws_url=``, or ASYNC_INFERENCE_WS_URL) and polls otherwise, with a backoff up to a cap; when the socket fails or
closes, it goes on polling the same job until the same deadline.

    from async_inference.client import Client

    with Client("https://api.example.com", "my-key") as client:
        job = client.submit({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
        job = client.wait(job.job_id)
        print(client.result(job).choices[0].message.content)

Importing this module imports neither boto3 nor the service's server side.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal, Mapping, TypeVar

import httpx2
import websockets.exceptions
from pydantic import BaseModel, ValidationError
from websockets.asyncio.client import connect as ws_connect_async
from websockets.sync.client import connect as ws_connect

from async_inference import settings
from async_inference.batches.models import Batch, FileObject, FileUpload, Page
from async_inference.jobs import FINAL_STATES, JobStatus
from async_inference.retry import DEFAULT_POLL, PUSH_CHECK_S, Backoff, RetryPolicy, parse_retry_after, poll_delay
from async_inference.schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    ErrorResponse,
    JobEvent,
    JobList,
    JobProgress,
    JobView,
    Subscription,
    WebhookSpec,
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

logger = logging.getLogger(__name__)
_Model = TypeVar("_Model", bound=BaseModel)
# What a WebSocket that failed or closed raises: the handshake refused, the socket dropped, a bad URL, a timeout.
_SOCKET_ERRORS: tuple[type[BaseException], ...] = (OSError, websockets.exceptions.WebSocketException)


# --- Errors ---------------------------------------------------------------------------------------------------------


class AsyncInferenceError(Exception):
    """Every error this client raises."""


class ApiError(AsyncInferenceError):
    """The API answered with an error status (after any retries). ``code``, ``message`` and ``details`` come from its
    ``{"error": {...}}`` body; ``retry_after`` is the seconds its Retry-After asked for, if it sent one."""

    def __init__(self, status: int, body: Any, *, retry_after: float | None = None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        self.code, self.message, self.details = _error_fields(status, body)
        super().__init__(f"HTTP {status} {self.code}: {self.message}")


class ApiUnreachable(AsyncInferenceError):
    """No answer came back: the connection was refused or dropped, or the request timed out (after any retries)."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach {url}: {reason}")


class UnexpectedResponse(AsyncInferenceError):
    """The API answered with a success status and a body that is not what the route returns."""


class BatchWaitTimeout(AsyncInferenceError, TimeoutError):
    """``wait_batch()`` gave up before the batch was final. The batch goes on; ``batch`` is the last view of it."""

    def __init__(self, batch: Batch, timeout_s: float) -> None:
        self.batch = batch
        self.timeout_s = timeout_s
        super().__init__(f"batch {batch.id} is still {batch.status.value} after {timeout_s:g} s")


class NoResult(AsyncInferenceError, ValueError):
    """``result()`` of a job that has not succeeded."""


class WaitTimeout(AsyncInferenceError, TimeoutError):
    """``wait()`` gave up before the job was final. The job goes on; ``job`` is the last view of it."""

    def __init__(self, job: JobView, timeout_s: float) -> None:
        self.job = job
        self.timeout_s = timeout_s
        super().__init__(f"job {job.job_id} is still {job.status.value} after {timeout_s:g} s")


class SubscriptionRefused(AsyncInferenceError):
    """The WebSocket API answered the subscription with an error (wait() then polls)."""


def _error_fields(status: int, body: Any) -> tuple[str, str, list[dict[str, str]]]:
    try:
        error = ErrorResponse.model_validate(body).error
        return error.code, error.message, [d.model_dump() for d in error.details]
    except ValidationError:
        pass
    # API Gateway's own refusals (a missing key, throttling) are {"message": "..."}; S3's are XML.
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return f"http_{status}", body["message"], []
    text = " ".join(str(body).split())
    return f"http_{status}", text[:300] or "(empty body)", []


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- What wait() reports --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobUpdate:
    """What ``wait()`` passes to ``on_update`` each time it learns something about the job.

    ``via`` says how: "poll" (a GET; ``job`` is the view it returned) or "push" (a WebSocket event). ``progress`` is a
    running job's tokens generated so far (``{completion_tokens, updated_at}``), when the server reports it; there is
    no fraction done, since ``max_tokens`` is a cap, not the length the job will reach."""

    job_id: str
    status: JobStatus
    progress: JobProgress | None = None
    via: Literal["poll", "push"] = "poll"
    job: JobView | None = None

    @classmethod
    def of_view(cls, job: JobView) -> JobUpdate:
        return cls(job_id=job.job_id, status=job.status, progress=job.progress, job=job)

    @classmethod
    def of_event(cls, event: JobEvent) -> JobUpdate:
        return cls(job_id=event.job_id, status=event.status, progress=event.progress, via="push")


OnUpdate = Callable[[JobUpdate], None]


# --- What both clients share ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
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


class _Core:
    """Where the API is, its key, the retry and poll schedules; building requests and reading answers."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        *,
        ws_url: str | None,
        timeout_s: float,
        retry: RetryPolicy | None,
        poll: Backoff,
        push_check_s: float,
        rng: random.Random | None,
        clock: Callable[[], float],
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

    # --- requests ---------------------------------------------------------------------------------------------------

    def _api(self, method: str, path: str, *, body: Any = None, params: dict[str, Any] | None = None,
             headers: Mapping[str, str] | None = None) -> _Call:
        headers = {API_KEY_HEADER: self._api_key, **(headers or {})}
        resend_safe = method == "GET" or IDEMPOTENCY_KEY_HEADER in headers
        return _Call(method, self.base_url + path, headers, json=body, params=params, resend_safe=resend_safe)

    @staticmethod
    def _submission(*, request: Any = None, upload_bytes: int | None = None, metadata: Mapping[str, str] | None,
                    webhook: Mapping[str, Any] | WebhookSpec | str | None, options: Mapping[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"metadata": dict(metadata or {}), **options}
        if request is not None:
            body["request"] = _plain(request)
        if upload_bytes is not None:
            body["upload"] = {"size_bytes": upload_bytes}
        if isinstance(webhook, str):
            body["webhook"] = {"url": webhook}
        elif webhook:
            body["webhook"] = _plain(webhook)
        return body

    @staticmethod
    def _batch_body(input_file_id: str, metadata: Mapping[str, str] | None, completion_window: str,
                    webhook: Mapping[str, Any] | str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"input_file_id": input_file_id, "endpoint": settings.BATCH_ENDPOINT,
                                "completion_window": completion_window}
        if metadata:
            body["metadata"] = dict(metadata)
        if webhook:
            body["webhook"] = {"url": webhook} if isinstance(webhook, str) else dict(webhook)
        return body

    def _upload_call(self, data: bytes, filename: str, purpose: str) -> _Call:
        """The inline upload's request (multipart ``POST /v1/files``)."""
        call = self._api("POST", "/v1/files")
        return _Call(call.method, call.url, call.headers, files={"file": (filename, data, "application/jsonl")},
                     data={"purpose": purpose})

    @staticmethod
    def _redirect(response: httpx2.Response) -> str | None:
        """Where a file content answer redirects to (a presigned GET), if it does."""
        location = response.headers.get("location")
        return location if response.status_code in (301, 302, 303, 307, 308) and location else None

    @staticmethod
    def _idempotency(key: str | None) -> dict[str, str]:
        return {IDEMPOTENCY_KEY_HEADER: key} if key else {}

    def _retry_delay(self, call: _Call, attempt: int, *, response: httpx2.Response | None = None,
                     error: httpx2.TransportError | None = None) -> float:
        """Seconds to wait before sending ``call`` again after its ``attempt``-th failure; raises when it is not to be
        sent again."""
        if response is None:
            assert error is not None
            delay = self.retry.delay(attempt, retry_after=None, rng=self._rng) if call.resend_safe else None
            if delay is None:
                raise ApiUnreachable(call.url.split("?")[0], _reason(error)) from error
            logger.info("%s %s: %s; sending again in %.2f s", call.method, call.url, _reason(error), delay)
            return delay
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        delay = None
        if response.status_code in self.retry.statuses:
            delay = self.retry.delay(attempt, retry_after=retry_after, rng=self._rng)
        if delay is None:
            raise ApiError(response.status_code, _body(response), retry_after=retry_after)
        logger.info("%s %s: HTTP %d; sending again in %.2f s", call.method, call.url, response.status_code, delay)
        return delay

    # --- answers ----------------------------------------------------------------------------------------------------

    @staticmethod
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

    @staticmethod
    def _result_job(job: JobView) -> None:
        if job.status is not JobStatus.SUCCEEDED or job.result is None:
            raise NoResult(f"job {job.job_id} is {job.status.value}, it has no result"
                           + (f": {job.error}" if job.error else ""))

    @staticmethod
    def _expired(job: JobView) -> bool:
        return job.result is not None and job.result.expires_at <= dt.datetime.now(dt.timezone.utc)

    def _subscribe_message(self, job_id: str) -> str:
        return Subscription(job_ids=[job_id]).model_dump_json(exclude_none=True)

    def _ws_options(self, deadline: float) -> dict[str, Any]:
        return {"additional_headers": {API_KEY_HEADER: self._api_key},
                "open_timeout": max(0.1, min(WS_OPEN_TIMEOUT_S, deadline - self._clock()))}

    @staticmethod
    def _subscription_reply(raw: str | bytes) -> bool:
        """True for the API's "subscribed" reply; SubscriptionRefused for its "error" reply; False for anything else
        (an event, a message this client does not know)."""
        try:
            reply = json.loads(raw)
        except ValueError:
            return False
        if not isinstance(reply, dict):
            return False
        if reply.get("type") == "error":
            raise SubscriptionRefused(f"{reply.get('code')}: {reply.get('message')}")
        return reply.get("type") == "subscribed"

    @staticmethod
    def _event_for(raw: str | bytes, job_id: str) -> JobEvent | None:
        """The message as an event about ``job_id``; None for anything else (another job, an acknowledgement, a
        message this client does not know)."""
        try:
            event = JobEvent.model_validate_json(raw)
        except ValidationError:
            logger.debug("WebSocket message ignored: %.200r", raw)
            return None
        return event if event.job_id == job_id else None


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return dict(value)


def _body(response: httpx2.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _request_bytes(request_body: bytes | Mapping[str, Any] | ChatCompletionRequest) -> bytes:
    if isinstance(request_body, bytes):
        return request_body
    if isinstance(request_body, ChatCompletionRequest):
        return request_body.model_dump_json(exclude_unset=True).encode()
    return json.dumps(dict(request_body)).encode()


def _is_final(job: JobView) -> bool:
    return job.status in FINAL_STATES


# --- The blocking client --------------------------------------------------------------------------------------------


class Client(_Core):
    """A blocking client for the HTTP API (v1).

    ``base_url`` and ``api_key`` default to ASYNC_INFERENCE_API_URL and ASYNC_INFERENCE_API_KEY; ``ws_url`` to
    ASYNC_INFERENCE_WS_URL (``""`` turns the WebSocket off). ``retry`` says when refused requests are sent again
    (``RetryPolicy()``: 4 retries); ``poll`` is wait()'s schedule between polls (``DEFAULT_POLL``); ``push_check_s``
    how long wait() trusts a silent WebSocket before it checks with a GET (60 s). ``sleep``, ``clock`` and ``rng``
    are there for tests.
    """

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
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(base_url, api_key, ws_url=ws_url, timeout_s=timeout_s, retry=retry, poll=poll,
                         push_check_s=push_check_s, rng=rng, clock=clock)
        self._sleep = sleep
        self._http = httpx2.Client(timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: _Call) -> httpx2.Response:
        attempt = 0
        while True:
            try:
                response = self._http.request(call.method, call.url, headers=call.headers, json=call.json,
                                              content=call.content, params=call.params, files=call.files,
                                              data=call.data)
            except httpx2.TransportError as exc:
                delay = self._retry_delay(call, attempt, error=exc)
            else:
                if response.status_code < 400:
                    return response
                delay = self._retry_delay(call, attempt, response=response)
            self._sleep(delay)
            attempt += 1

    # --- files and batches (the OpenAI Batch API; docs/batches.md) --------------------------------------------------

    def upload_file(self, data: bytes, *, filename: str = "input.jsonl", purpose: str = "batch") -> FileObject:
        """Upload a batch input file: in the request (``POST /v1/files``) up to settings.MAX_FILE_INLINE_BYTES, through
        a presigned PUT beyond (``POST /v1/files/uploads``, up to settings.BATCH_MAX_FILE_BYTES)."""
        if len(data) <= settings.MAX_FILE_INLINE_BYTES:
            return self._parse(self._send(self._upload_call(data, filename, purpose)), FileObject)
        body = {"filename": filename, "purpose": purpose, "bytes": len(data)}
        created = self._parse(self._send(self._api("POST", "/v1/files/uploads", body=body)), FileUpload)
        self._send(_Call("PUT", created.upload.url, dict(created.upload.headers), content=data, resend_safe=True))
        return self._parse(self._send(self._api("GET", f"/v1/files/{created.id}")), FileObject)

    def file_content(self, file_id: str) -> bytes:
        """A file's bytes: the API answers with a redirect to a presigned GET, which is fetched without the key."""
        response = self._send(self._api("GET", f"/v1/files/{file_id}/content"))
        location = self._redirect(response)
        if location is None:
            return response.content
        return self._send(_Call("GET", location, {}, resend_safe=True)).content

    def create_batch(self, input_file_id: str, *, metadata: Mapping[str, str] | None = None,
                     completion_window: str = "24h", webhook: Mapping[str, Any] | str | None = None) -> Batch:
        """A batch over an uploaded input file; ``webhook`` (a URL, or ``{"url", "events"}``): its end is POSTed
        there as OpenAI's webhook event, signed with the tenant's secret."""
        body = self._batch_body(input_file_id, metadata, completion_window, webhook)
        return self._parse(self._send(self._api("POST", "/v1/batches", body=body)), Batch)

    def get_batch(self, batch_id: str) -> Batch:
        return self._parse(self._send(self._api("GET", f"/v1/batches/{batch_id}")), Batch)

    def list_batches(self, *, after: str | None = None, limit: int | None = None) -> Page[Batch]:
        """One page of the tenant's batches, newest first; pass ``.last_id`` as ``after`` while ``.has_more``."""
        params = {k: v for k, v in {"after": after, "limit": limit}.items() if v is not None}
        return self._parse(self._send(self._api("GET", "/v1/batches", params=params)), Page[Batch])

    def cancel_batch(self, batch_id: str) -> Batch:
        return self._parse(self._send(self._api("POST", f"/v1/batches/{batch_id}/cancel")), Batch)

    def wait_batch(self, batch_id: str, *, timeout_s: float = 24 * 3600.0,
                   on_update: Callable[[Batch], None] | None = None, poll: Backoff | None = None) -> Batch:
        """Poll until the batch is final (completed, failed, expired, cancelled); BatchWaitTimeout after
        ``timeout_s`` (the batch goes on). ``on_update`` gets every view (request_counts for a progress bar)."""
        deadline = self._clock() + timeout_s
        attempt = 0
        while True:
            batch = self.get_batch(batch_id)
            if on_update:
                on_update(batch)
            if batch.status.is_final:
                return batch
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise BatchWaitTimeout(batch, timeout_s)
            self._sleep(min(remaining, poll_delay(poll or self.poll, attempt, retry_after=None, rng=self._rng)))
            attempt += 1

    # --- the API ----------------------------------------------------------------------------------------------------

    def submit(self, request: Mapping[str, Any] | ChatCompletionRequest, *, metadata: Mapping[str, str] | None = None,
               webhook: Mapping[str, Any] | WebhookSpec | str | None = None, idempotency_key: str | None = None,
               **options: Any) -> JobView:
        """Submit a chat.completions body inline; the job (status ``queued``). ``options``: ``ttl_seconds``,
        ``timeout_seconds``. The same ``idempotency_key`` again returns the same job."""
        body = self._submission(request=request, metadata=metadata, webhook=webhook, options=options)
        call = self._api("POST", "/v1/jobs", body=body, headers=self._idempotency(idempotency_key))
        return self._parse(self._send(call), JobView)

    def submit_upload(self, request_body: bytes | Mapping[str, Any] | ChatCompletionRequest, *,
                      metadata: Mapping[str, str] | None = None,
                      webhook: Mapping[str, Any] | WebhookSpec | str | None = None,
                      idempotency_key: str | None = None, **options: Any) -> JobView:
        """Create an upload job and PUT the body to its presigned URL (the claim-check path for large requests); the
        job as created (``awaiting_upload`` until the upload is checked). A retry with the same ``idempotency_key``
        after the upload went through returns the job and uploads nothing."""
        data = _request_bytes(request_body)
        body = self._submission(upload_bytes=len(data), metadata=metadata, webhook=webhook, options=options)
        job = self._parse(self._send(self._api("POST", "/v1/jobs", body=body,
                                               headers=self._idempotency(idempotency_key))), JobView)
        if job.upload is not None:
            self._send(_Call("PUT", job.upload.url, dict(job.upload.headers), content=data, resend_safe=True))
        return job

    def get(self, job_id: str) -> JobView:
        return self._parse(self._send(self._api("GET", f"/v1/jobs/{job_id}")), JobView)

    def list(self, *, status: JobStatus | str | None = None, limit: int | None = None,
             next_token: str | None = None) -> JobList:
        """One page of the tenant's jobs, newest first; pass ``.next`` as ``next_token`` for the following one."""
        params = {k: v for k, v in {"status": _value(status), "limit": limit, "next": next_token}.items() if v is not None}
        return self._parse(self._send(self._api("GET", "/v1/jobs", params=params)), JobList)

    def cancel(self, job_id: str) -> JobView:
        """Cancel a job that has not finished (ApiError 409 if it has)."""
        return self._parse(self._send(self._api("POST", f"/v1/jobs/{job_id}/cancel")), JobView)

    def result(self, job: JobView | str) -> ChatCompletion:
        """The chat.completion of a succeeded job (a view or its id), from its presigned URL; NoResult otherwise."""
        view = self.get(job) if isinstance(job, str) else job
        if self._expired(view):
            view = self.get(view.job_id)
        self._result_job(view)
        assert view.result is not None
        return self._parse(self._send(_Call("GET", view.result.url, {}, resend_safe=True)), ChatCompletion)

    # --- waiting ----------------------------------------------------------------------------------------------------

    def wait(self, job_id: str, *, timeout_s: float = 600.0, on_update: OnUpdate | None = None,
             poll: Backoff | None = None) -> JobView:
        """Block until the job is final; its final view. WaitTimeout after ``timeout_s`` (the job goes on).

        Over the WebSocket API when ``ws_url`` is set, polling otherwise or once the socket fails or closes.
        ``on_update`` gets a JobUpdate for each poll and each event; ``poll`` replaces the client's schedule."""
        deadline = self._clock() + timeout_s
        notify = on_update or (lambda update: None)
        if self.ws_url:
            job = self._wait_pushed(job_id, deadline, timeout_s, notify)
            if job is not None:
                return job
        return self._wait_polled(job_id, deadline, timeout_s, notify, poll or self.poll)

    def _get_job(self, job_id: str) -> tuple[JobView, float | None]:
        response = self._send(self._api("GET", f"/v1/jobs/{job_id}"))
        return self._parse(response, JobView), parse_retry_after(response.headers.get("retry-after"))

    def _wait_polled(self, job_id: str, deadline: float, timeout_s: float, notify: OnUpdate,
                     schedule: Backoff) -> JobView:
        attempt = 0
        while True:
            job, retry_after = self._get_job(job_id)
            notify(JobUpdate.of_view(job))
            if _is_final(job):
                return job
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise WaitTimeout(job, timeout_s)
            self._sleep(min(remaining, poll_delay(schedule, attempt, retry_after=retry_after, rng=self._rng)))
            attempt += 1

    def _until_subscribed(self, socket: Any, deadline: float) -> None:
        """Wait for the API's reply to the subscription (at most WS_SUBSCRIBE_REPLY_S); what comes before it is older
        than the GET that follows, and is dropped."""
        # The socket's own timeouts are real time, whatever clock the client was given.
        ends = time.monotonic() + min(WS_SUBSCRIBE_REPLY_S, max(0.0, deadline - self._clock()))
        while (left := ends - time.monotonic()) > 0:
            try:
                if self._subscription_reply(socket.recv(timeout=left)):
                    return
            except TimeoutError:
                return

    def _wait_pushed(self, job_id: str, deadline: float, timeout_s: float, notify: OnUpdate) -> JobView | None:
        """Follow the job over the WebSocket until it is final; None when the socket failed or closed first."""
        assert self.ws_url is not None
        with contextlib.ExitStack() as opened:
            try:
                socket = opened.enter_context(ws_connect(self.ws_url, **self._ws_options(deadline)))
                socket.send(self._subscribe_message(job_id))
                self._until_subscribed(socket, deadline)
            except (*_SOCKET_ERRORS, SubscriptionRefused) as exc:
                logger.warning("WebSocket %s: %s; polling instead", self.ws_url, _reason(exc))
                return None
            # Read once subscribed: an end that came before the subscription is seen here rather than missed.
            job, _ = self._get_job(job_id)
            notify(JobUpdate.of_view(job))
            while not _is_final(job):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise WaitTimeout(job, timeout_s)
                try:
                    raw = socket.recv(timeout=min(remaining, self.push_check_s))
                except TimeoutError:
                    job, _ = self._get_job(job_id)
                    notify(JobUpdate.of_view(job))
                    continue
                except _SOCKET_ERRORS as exc:
                    logger.warning("WebSocket %s closed (%s); polling instead", self.ws_url, _reason(exc))
                    return None
                event = self._event_for(raw, job_id)
                if event is None:
                    continue
                notify(JobUpdate.of_event(event))
                if event.status in FINAL_STATES:
                    job, _ = self._get_job(job_id)  # the final view: result URL, usage, error
                    notify(JobUpdate.of_view(job))
            return job


# --- The asyncio client ---------------------------------------------------------------------------------------------


class AsyncClient(_Core):
    """The asyncio twin of ``Client``: the same arguments and methods, each a coroutine; ``sleep`` is awaited."""

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
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(base_url, api_key, ws_url=ws_url, timeout_s=timeout_s, retry=retry, poll=poll,
                         push_check_s=push_check_s, rng=rng, clock=clock)
        self._sleep = sleep
        self._http = httpx2.AsyncClient(timeout=timeout_s)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: _Call) -> httpx2.Response:
        attempt = 0
        while True:
            try:
                response = await self._http.request(call.method, call.url, headers=call.headers, json=call.json,
                                                    content=call.content, params=call.params, files=call.files,
                                                    data=call.data)
            except httpx2.TransportError as exc:
                delay = self._retry_delay(call, attempt, error=exc)
            else:
                if response.status_code < 400:
                    return response
                delay = self._retry_delay(call, attempt, response=response)
            await self._sleep(delay)
            attempt += 1

    # --- files and batches (the same as Client's) -------------------------------------------------------------------

    async def upload_file(self, data: bytes, *, filename: str = "input.jsonl", purpose: str = "batch") -> FileObject:
        if len(data) <= settings.MAX_FILE_INLINE_BYTES:
            return self._parse(await self._send(self._upload_call(data, filename, purpose)), FileObject)
        body = {"filename": filename, "purpose": purpose, "bytes": len(data)}
        created = self._parse(await self._send(self._api("POST", "/v1/files/uploads", body=body)), FileUpload)
        await self._send(_Call("PUT", created.upload.url, dict(created.upload.headers), content=data, resend_safe=True))
        return self._parse(await self._send(self._api("GET", f"/v1/files/{created.id}")), FileObject)

    async def file_content(self, file_id: str) -> bytes:
        response = await self._send(self._api("GET", f"/v1/files/{file_id}/content"))
        location = self._redirect(response)
        if location is None:
            return response.content
        return (await self._send(_Call("GET", location, {}, resend_safe=True))).content

    async def create_batch(self, input_file_id: str, *, metadata: Mapping[str, str] | None = None,
                           completion_window: str = "24h", webhook: Mapping[str, Any] | str | None = None) -> Batch:
        body = self._batch_body(input_file_id, metadata, completion_window, webhook)
        return self._parse(await self._send(self._api("POST", "/v1/batches", body=body)), Batch)

    async def get_batch(self, batch_id: str) -> Batch:
        return self._parse(await self._send(self._api("GET", f"/v1/batches/{batch_id}")), Batch)

    async def list_batches(self, *, after: str | None = None, limit: int | None = None) -> Page[Batch]:
        params = {k: v for k, v in {"after": after, "limit": limit}.items() if v is not None}
        return self._parse(await self._send(self._api("GET", "/v1/batches", params=params)), Page[Batch])

    async def cancel_batch(self, batch_id: str) -> Batch:
        return self._parse(await self._send(self._api("POST", f"/v1/batches/{batch_id}/cancel")), Batch)

    async def wait_batch(self, batch_id: str, *, timeout_s: float = 24 * 3600.0,
                         on_update: Callable[[Batch], None] | None = None, poll: Backoff | None = None) -> Batch:
        deadline = self._clock() + timeout_s
        attempt = 0
        while True:
            batch = await self.get_batch(batch_id)
            if on_update:
                on_update(batch)
            if batch.status.is_final:
                return batch
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise BatchWaitTimeout(batch, timeout_s)
            await self._sleep(min(remaining, poll_delay(poll or self.poll, attempt, retry_after=None, rng=self._rng)))
            attempt += 1

    # --- jobs -------------------------------------------------------------------------------------------------------

    async def submit(self, request: Mapping[str, Any] | ChatCompletionRequest, *,
                     metadata: Mapping[str, str] | None = None,
                     webhook: Mapping[str, Any] | WebhookSpec | str | None = None,
                     idempotency_key: str | None = None, **options: Any) -> JobView:
        body = self._submission(request=request, metadata=metadata, webhook=webhook, options=options)
        call = self._api("POST", "/v1/jobs", body=body, headers=self._idempotency(idempotency_key))
        return self._parse(await self._send(call), JobView)

    async def submit_upload(self, request_body: bytes | Mapping[str, Any] | ChatCompletionRequest, *,
                            metadata: Mapping[str, str] | None = None,
                            webhook: Mapping[str, Any] | WebhookSpec | str | None = None,
                            idempotency_key: str | None = None, **options: Any) -> JobView:
        data = _request_bytes(request_body)
        body = self._submission(upload_bytes=len(data), metadata=metadata, webhook=webhook, options=options)
        job = self._parse(await self._send(self._api("POST", "/v1/jobs", body=body,
                                                     headers=self._idempotency(idempotency_key))), JobView)
        if job.upload is not None:
            await self._send(_Call("PUT", job.upload.url, dict(job.upload.headers), content=data, resend_safe=True))
        return job

    async def get(self, job_id: str) -> JobView:
        return self._parse(await self._send(self._api("GET", f"/v1/jobs/{job_id}")), JobView)

    async def list(self, *, status: JobStatus | str | None = None, limit: int | None = None,
                   next_token: str | None = None) -> JobList:
        params = {k: v for k, v in {"status": _value(status), "limit": limit, "next": next_token}.items() if v is not None}
        return self._parse(await self._send(self._api("GET", "/v1/jobs", params=params)), JobList)

    async def cancel(self, job_id: str) -> JobView:
        return self._parse(await self._send(self._api("POST", f"/v1/jobs/{job_id}/cancel")), JobView)

    async def result(self, job: JobView | str) -> ChatCompletion:
        view = await self.get(job) if isinstance(job, str) else job
        if self._expired(view):
            view = await self.get(view.job_id)
        self._result_job(view)
        assert view.result is not None
        return self._parse(await self._send(_Call("GET", view.result.url, {}, resend_safe=True)), ChatCompletion)

    async def wait(self, job_id: str, *, timeout_s: float = 600.0, on_update: OnUpdate | None = None,
                   poll: Backoff | None = None) -> JobView:
        deadline = self._clock() + timeout_s
        notify = on_update or (lambda update: None)
        if self.ws_url:
            job = await self._wait_pushed(job_id, deadline, timeout_s, notify)
            if job is not None:
                return job
        return await self._wait_polled(job_id, deadline, timeout_s, notify, poll or self.poll)

    async def _get_job(self, job_id: str) -> tuple[JobView, float | None]:
        response = await self._send(self._api("GET", f"/v1/jobs/{job_id}"))
        return self._parse(response, JobView), parse_retry_after(response.headers.get("retry-after"))

    async def _wait_polled(self, job_id: str, deadline: float, timeout_s: float, notify: OnUpdate,
                           schedule: Backoff) -> JobView:
        attempt = 0
        while True:
            job, retry_after = await self._get_job(job_id)
            notify(JobUpdate.of_view(job))
            if _is_final(job):
                return job
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise WaitTimeout(job, timeout_s)
            await self._sleep(min(remaining, poll_delay(schedule, attempt, retry_after=retry_after, rng=self._rng)))
            attempt += 1

    async def _until_subscribed(self, socket: Any, deadline: float) -> None:
        ends = time.monotonic() + min(WS_SUBSCRIBE_REPLY_S, max(0.0, deadline - self._clock()))
        while (left := ends - time.monotonic()) > 0:
            try:
                if self._subscription_reply(await asyncio.wait_for(socket.recv(), timeout=left)):
                    return
            except TimeoutError:
                return

    async def _wait_pushed(self, job_id: str, deadline: float, timeout_s: float, notify: OnUpdate) -> JobView | None:
        assert self.ws_url is not None
        try:
            socket = await ws_connect_async(self.ws_url, **self._ws_options(deadline))
        except _SOCKET_ERRORS as exc:
            logger.warning("WebSocket %s: %s; polling instead", self.ws_url, _reason(exc))
            return None
        async with socket:
            try:
                await socket.send(self._subscribe_message(job_id))
                await self._until_subscribed(socket, deadline)
            except (*_SOCKET_ERRORS, SubscriptionRefused) as exc:
                logger.warning("WebSocket %s: %s; polling instead", self.ws_url, _reason(exc))
                return None
            job, _ = await self._get_job(job_id)
            notify(JobUpdate.of_view(job))
            while not _is_final(job):
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise WaitTimeout(job, timeout_s)
                try:
                    raw = await asyncio.wait_for(socket.recv(), timeout=min(remaining, self.push_check_s))
                except TimeoutError:
                    job, _ = await self._get_job(job_id)
                    notify(JobUpdate.of_view(job))
                    continue
                except _SOCKET_ERRORS as exc:
                    logger.warning("WebSocket %s closed (%s); polling instead", self.ws_url, _reason(exc))
                    return None
                event = self._event_for(raw, job_id)
                if event is None:
                    continue
                notify(JobUpdate.of_event(event))
                if event.status in FINAL_STATES:
                    job, _ = await self._get_job(job_id)
                    notify(JobUpdate.of_view(job))
            return job


def _value(status: JobStatus | str | None) -> str | None:
    return status.value if isinstance(status, JobStatus) else status
