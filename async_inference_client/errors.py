"""What the client raises: every error is an ``AsyncInferenceError``."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from async_inference_client.models.batches import Batch
from async_inference_client.models.jobs import ErrorResponse, JobView


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


def describe(exc: BaseException) -> str:
    """An exception as one line: its type, and its message when it has one."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
