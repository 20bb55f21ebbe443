"""The Python SDK for the HTTP API (v1): ``Client`` (blocking) and ``AsyncClient`` (asyncio), with the same methods.

Results are the wire models of ``async_inference_client.models``: ``JobView``, ``JobList``, ``ChatCompletion``,
``Batch``. A request the API refuses with 429 or 503 is sent again after the server's ``Retry-After``, or after an
exponential backoff with jitter (``async_inference_client.retry``). ``wait()`` follows a job over the WebSocket API
when it knows that API's URL (``ws_url=``, or ASYNC_INFERENCE_WS_URL) and polls otherwise, with a backoff up to a cap;
when the socket fails or closes, it goes on polling the same job until the same deadline.

    from async_inference_client import Client

    with Client("https://api.example.com", "my-key") as client:
        job = client.submit({"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
        job = client.wait(job.job_id)
        print(client.result(job).choices[0].message.content)

Both clients run the same operations (``_base_client.BaseClient``); each only carries out their effects, blocking or
awaiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Unpack

import httpx2
from websockets.asyncio.client import connect as ws_connect_async
from websockets.sync.client import connect as ws_connect

from async_inference_client._base_client import BaseClient
from async_inference_client._effects import Connect, Disconnect, Effect, Flow, Receive, Run, Send, Sleep, T, Transmit
from async_inference_client.models.batches import Batch, FileObject, Page
from async_inference_client.models.chat import ChatCompletion
from async_inference_client.models.embeddings import EmbeddingList
from async_inference_client.models.jobs import JobList, JobView
from async_inference_client.types import (
    BatchOptions,
    BatchWaitOptions,
    ListOptions,
    RequestBody,
    SubmitOptions,
    WaitOptions,
)


class Client(BaseClient):
    """A blocking client for the HTTP API (v1).

    ``base_url`` and ``api_key`` default to ASYNC_INFERENCE_API_URL and ASYNC_INFERENCE_API_KEY; ``ws_url`` to
    ASYNC_INFERENCE_WS_URL (``""`` turns the WebSocket off). ``retry`` says when refused requests are sent again
    (``RetryPolicy()``: 4 retries); ``poll`` is wait()'s schedule between polls (``DEFAULT_POLL``); ``push_check_s``
    how long wait() trusts a silent WebSocket before it checks with a GET (60 s). ``sleep``, ``clock`` and ``rng``
    are there for tests.
    """

    _http: httpx2.Client
    _sleep: Callable[[float], None]
    _default_sleep = staticmethod(time.sleep)
    _http_class = httpx2.Client

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, flow: Flow[T]) -> T:
        run = Run(flow)
        while not run.done:
            try:
                outcome = self._perform(run.effect)
            except BaseException as exc:  # handed to the operation: it decides (a lost connection is retried)
                run.failed(exc)
            else:
                run.succeeded(outcome)
        return run.value

    def _perform(self, effect: Effect) -> Any:
        match effect:
            case Send(call):
                return self._http.request(**call.arguments())
            case Sleep(seconds):
                return self._sleep(seconds)
            case Connect(url, options):
                # Entered here and closed by Disconnect: the operation holds the socket across several effects.
                return ws_connect(url, **options).__enter__()
            case Transmit(socket, text):
                return socket.send(text)
            case Receive(socket, timeout_s):
                return socket.recv(timeout=timeout_s)
            case Disconnect(socket):
                return socket.close()

    # --- files and batches (the OpenAI Batch API; docs/batches.md) --------------------------------------------------

    def upload_file(self, data: bytes, *, filename: str = "input.jsonl", purpose: str = "batch") -> FileObject:
        """Upload a batch input file: in the request (``POST /v1/files``) up to limits.MAX_FILE_INLINE_BYTES, through
        a presigned PUT beyond (``POST /v1/files/uploads``, up to the service's BATCH_MAX_FILE_BYTES)."""
        return self._run(self._upload_file(data, filename, purpose))

    def file_content(self, file_id: str) -> bytes:
        """A file's bytes: the API answers with a redirect to a presigned GET, which is fetched without the key."""
        return self._run(self._file_content(file_id))

    def create_batch(self, input_file_id: str, **options: Unpack[BatchOptions]) -> Batch:
        """A batch over an uploaded input file (options: BatchOptions)."""
        return self._run(self._create_batch(input_file_id, options))

    def get_batch(self, batch_id: str) -> Batch:
        return self._run(self._get_batch(batch_id))

    def list_batches(self, *, after: str | None = None, limit: int | None = None) -> Page[Batch]:
        """One page of the tenant's batches, newest first; pass ``.last_id`` as ``after`` while ``.has_more``."""
        return self._run(self._list_batches(after, limit))

    def cancel_batch(self, batch_id: str) -> Batch:
        return self._run(self._cancel_batch(batch_id))

    def wait_batch(self, batch_id: str, **options: Unpack[BatchWaitOptions]) -> Batch:
        """Poll until the batch is final (completed, failed, expired, cancelled); BatchWaitTimeout after
        ``timeout_s`` (the batch goes on). Options: BatchWaitOptions."""
        return self._run(self._wait_batch(batch_id, options))

    # --- jobs -------------------------------------------------------------------------------------------------------

    def submit(self, request: RequestBody, **options: Unpack[SubmitOptions]) -> JobView:
        """Submit a chat.completions body inline (an embeddings body with ``endpoint="/v1/embeddings"``); the job
        (status ``queued``). Options: SubmitOptions; the same ``idempotency_key`` again returns the same job."""
        return self._run(self._submit_inline(request, options))

    def submit_upload(self, request_body: bytes | RequestBody, **options: Unpack[SubmitOptions]) -> JobView:
        """Create an upload job and PUT the body to its presigned URL (the claim-check path for large requests); the
        job as created (``awaiting_upload`` until the upload is checked). A retry with the same ``idempotency_key``
        after the upload went through returns the job and uploads nothing."""
        return self._run(self._submit_upload(request_body, options))

    def get(self, job_id: str) -> JobView:
        return self._run(self._get(job_id))

    def list(self, **options: Unpack[ListOptions]) -> JobList:
        """One page of the tenant's jobs, newest first (options: ListOptions)."""
        return self._run(self._list(options))

    def cancel(self, job_id: str) -> JobView:
        """Cancel a job that has not finished (ApiError 409 if it has)."""
        return self._run(self._cancel(job_id))

    def result(self, job: JobView | str) -> ChatCompletion:
        """The chat.completion of a succeeded job (a view or its id), from its presigned URL; NoResult otherwise."""
        return self._run(self._result(job))

    def embeddings(self, job: JobView | str) -> EmbeddingList:
        """The embedding list of a succeeded job submitted with ``endpoint="/v1/embeddings"``, from its presigned URL;
        NoResult otherwise."""
        return self._run(self._embeddings(job))

    def wait(self, job_id: str, **options: Unpack[WaitOptions]) -> JobView:
        """Block until the job is final; its final view. WaitTimeout after ``timeout_s`` (the job goes on).

        Over the WebSocket API when ``ws_url`` is set, polling otherwise or once the socket fails or closes.
        ``on_update`` gets a JobUpdate for each poll and each event (options: WaitOptions)."""
        return self._run(self._wait(job_id, options))


class AsyncClient(BaseClient):
    """The asyncio twin of ``Client``: the same arguments and methods, each a coroutine; ``sleep`` is awaited."""

    _http: httpx2.AsyncClient
    _sleep: Callable[[float], Awaitable[None]]
    _default_sleep = staticmethod(asyncio.sleep)
    _http_class = httpx2.AsyncClient

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, flow: Flow[T]) -> T:
        run = Run(flow)
        while not run.done:
            try:
                outcome = await self._perform(run.effect)
            except BaseException as exc:  # cancellation too: the operation closes its socket on the way out
                run.failed(exc)
            else:
                run.succeeded(outcome)
        return run.value

    async def _perform(self, effect: Effect) -> Any:
        match effect:
            case Send(call):
                return await self._http.request(**call.arguments())
            case Sleep(seconds):
                return await self._sleep(seconds)
            case Connect(url, options):
                return await ws_connect_async(url, **options)
            case Transmit(socket, text):
                return await socket.send(text)
            case Receive(socket, timeout_s):
                return await asyncio.wait_for(socket.recv(), timeout=timeout_s)
            case Disconnect(socket):
                return await socket.close()

    # --- files and batches: as Client's -----------------------------------------------------------------------------

    async def upload_file(self, data: bytes, *, filename: str = "input.jsonl", purpose: str = "batch") -> FileObject:
        return await self._run(self._upload_file(data, filename, purpose))

    async def file_content(self, file_id: str) -> bytes:
        return await self._run(self._file_content(file_id))

    async def create_batch(self, input_file_id: str, **options: Unpack[BatchOptions]) -> Batch:
        return await self._run(self._create_batch(input_file_id, options))

    async def get_batch(self, batch_id: str) -> Batch:
        return await self._run(self._get_batch(batch_id))

    async def list_batches(self, *, after: str | None = None, limit: int | None = None) -> Page[Batch]:
        return await self._run(self._list_batches(after, limit))

    async def cancel_batch(self, batch_id: str) -> Batch:
        return await self._run(self._cancel_batch(batch_id))

    async def wait_batch(self, batch_id: str, **options: Unpack[BatchWaitOptions]) -> Batch:
        return await self._run(self._wait_batch(batch_id, options))

    # --- jobs: as Client's -----------------------------------------------------------------------------------------

    async def submit(self, request: RequestBody, **options: Unpack[SubmitOptions]) -> JobView:
        return await self._run(self._submit_inline(request, options))

    async def submit_upload(self, request_body: bytes | RequestBody, **options: Unpack[SubmitOptions]) -> JobView:
        return await self._run(self._submit_upload(request_body, options))

    async def get(self, job_id: str) -> JobView:
        return await self._run(self._get(job_id))

    async def list(self, **options: Unpack[ListOptions]) -> JobList:
        return await self._run(self._list(options))

    async def cancel(self, job_id: str) -> JobView:
        return await self._run(self._cancel(job_id))

    async def result(self, job: JobView | str) -> ChatCompletion:
        return await self._run(self._result(job))

    async def embeddings(self, job: JobView | str) -> EmbeddingList:
        return await self._run(self._embeddings(job))

    async def wait(self, job_id: str, **options: Unpack[WaitOptions]) -> JobView:
        return await self._run(self._wait(job_id, options))
