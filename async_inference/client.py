"""A small client for the HTTP API (v1), used by the CLI, the demo and the end-to-end tests."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import requests

from async_inference.jobs import FINAL_STATES, JobStatus


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = error.get("message") or (body.get("message") if isinstance(body, dict) else None) or str(body)
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body


class Client:
    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = requests.Session()
        self._session.headers.update({"x-api-key": api_key})
        self._timeout_s = timeout_s

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self._session.request(method, self.base_url + path, timeout=self._timeout_s, **kwargs)
        try:
            body = response.json()
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body

    def submit(self, request: dict[str, Any], *, metadata: dict[str, str] | None = None,
               webhook: dict[str, Any] | None = None, idempotency_key: str | None = None, **options: Any) -> dict[str, Any]:
        """Submit a chat.completions body inline; the job as the API returns it (status ``queued``)."""
        body = {"request": request, "metadata": metadata or {}, **options}
        if webhook:
            body["webhook"] = webhook
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=body, headers=headers)

    def submit_upload(self, request_body: bytes, *, metadata: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
        """Create an upload job and PUT ``request_body`` to its presigned URL (the claim-check path for large
        requests); the job as created (status ``awaiting_upload`` until the upload is checked)."""
        job = self._call("POST", "/v1/jobs", json={"upload": {"size_bytes": len(request_body)}, "metadata": metadata or {}, **options})
        upload = job["upload"]
        response = requests.put(upload["url"], data=request_body, headers=upload["headers"], timeout=self._timeout_s)
        if response.status_code >= 300:
            raise ApiError(response.status_code, response.text)
        return job

    def get(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}")

    def list(self, *, status: str | None = None, limit: int | None = None, next_token: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in {"status": status, "limit": limit, "next": next_token}.items() if v is not None}
        return self._call("GET", "/v1/jobs", params=params)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def result(self, job: dict[str, Any]) -> dict[str, Any]:
        """The chat.completion of a succeeded job, fetched from its presigned URL."""
        if job.get("status") != JobStatus.SUCCEEDED.value or not job.get("result"):
            raise ValueError(f"job {job.get('job_id')} is {job.get('status')}, it has no result")
        response = requests.get(job["result"]["url"], timeout=self._timeout_s)
        response.raise_for_status()
        return json.loads(response.content)

    def wait(self, job_id: str, *, timeout_s: float = 600.0, poll_s: float = 0.5,
             on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until the job is final; the final job. TimeoutError when it is not final in ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if on_poll:
                on_poll(job)
            if JobStatus(job["status"]) in FINAL_STATES:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s} s")
            time.sleep(poll_s)
