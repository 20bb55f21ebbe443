"""Background responses over the jobs API (``JobApi``): a response is a job whose original Responses body is kept beside it.

Create writes the body (``settings.responses_request_key``) before the job exists, then submits the converted chat
request as an ordinary job (same queue, claim check, worker, state and notifications); every read is the job's read
(another tenant's id is a 404) plus that body, and the job's result object once it has succeeded.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError

from async_inference import conversation, settings
from async_inference.conversation import Turn
from async_inference.endpoints import RESPONSES_ENDPOINT
from async_inference.jobs import FINAL_STATES, JobStatus, new_job_id
from async_inference.jobs_service import ErrorKind, JobApi, ServiceError, describe_validation_error
from async_inference.responses import (
    IDEMPOTENCY_NAMESPACE,
    input_items,
    job_id_of,
    output_items,
    response_id_of,
    to_chat_request,
    to_response,
)
from async_inference.schemas import ChatCompletion, Job, JobSubmission, utcnow
from async_inference.schemas.responses import InputItemList, Item, Response, ResponseCreate, ResponseDeleted


class ResponseService:
    def __init__(self, jobs: JobApi) -> None:
        self.jobs = jobs
        self.models = jobs.models
        self.blobs = jobs.blobs

    def create(self, tenant: str, request: ResponseCreate, idempotency_key: str | None = None) -> Response:
        """Queue the response's job; the Response as it stands (``queued``). With ``previous_response_id`` the job
        runs the stored conversation it continues, then the input (async_inference.conversation)."""
        items = self._conversation(tenant, request)
        try:
            chat = to_chat_request(request, items)
        except ValidationError as exc:  # a limit of the chat request the Responses model does not repeat
            message, details = describe_validation_error(exc)
            raise ServiceError(
                ErrorKind.INVALID,
                "invalid_request",
                f"the request converts to an invalid chat request: {message}",
                details,
            ) from exc
        self.models.check_model(request.model, field="model")
        self.models.check_limits(tenant, chat, endpoint=RESPONSES_ENDPOINT)  # before its body is stored
        key = None if idempotency_key is None else IDEMPOTENCY_NAMESPACE + idempotency_key
        job_id = new_job_id(tenant, key)
        # Written before the job exists, so no reader sees a response's job without its body; never over an
        # earlier request's body under the same Idempotency-Key (submit then replays or refuses that request).
        self.blobs.put_json_once(
            settings.responses_request_key(tenant, job_id),
            request.model_dump_json(exclude_none=True, by_alias=True).encode(),
        )
        webhook = request.webhook
        submission = JobSubmission.model_validate(
            {
                "request": chat,
                "metadata": request.metadata or {},
                **({"webhook": {"url": webhook.url}} if webhook else {}),
            }
        )
        submitted = self.jobs.submit(
            tenant, submission, idempotency_key, job_id=job_id, webhook_events=list(webhook.events) if webhook else None
        )
        return to_response(submitted.job, request if submitted.created else self._original(submitted.job))

    def retrieve(self, tenant: str, response_id: str) -> Response:
        job, original = self._get(tenant, response_id)
        return to_response(job, original, self._result(job))

    def cancel(self, tenant: str, response_id: str) -> Response:
        """Cancel a queued or running response (the worker aborts it); cancelling a cancelled one answers it again,
        as OpenAI does; a response that ended otherwise is a 409."""
        job, original = self._get(tenant, response_id)
        if job.status is not JobStatus.CANCELLED:
            try:
                job = self.jobs.cancel(tenant, job.job_id)
            except ServiceError as exc:
                if exc.kind is not ErrorKind.CONFLICT:
                    raise
                ended = to_response(self.jobs.get(tenant, job.job_id), original).status
                raise ServiceError(
                    ErrorKind.CONFLICT, "conflict", f"response {response_id} is already {ended} and cannot be cancelled"
                ) from exc
        return to_response(job, original)

    def delete(self, tenant: str, response_id: str) -> ResponseDeleted:
        """Delete a response: an unfinished one is cancelled first; its job goes with it (record, request and result:
        GET /v1/jobs/{id} and a result URL given out before are 404s), then its Responses body, so the id is a 404
        from then on (a crash in between leaves the body unreachable, for the bucket's lifecycle)."""
        job, _ = self._get(tenant, response_id)
        if job.status not in FINAL_STATES:
            try:
                self.jobs.cancel(tenant, job.job_id)
            except ServiceError as exc:
                if exc.kind is not ErrorKind.CONFLICT:  # it ended meanwhile, nothing to stop
                    raise
        self.jobs.delete(tenant, job.job_id)
        self.blobs.delete(settings.responses_request_key(tenant, job.job_id))
        return ResponseDeleted(id=response_id)

    def input_items(
        self, tenant: str, response_id: str, *, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> InputItemList:
        """The response's input items, OpenAI's cursor page (``order`` desc by default, as OpenAI's)."""
        _, original = self._get(tenant, response_id)
        items = input_items(response_id, original)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise ServiceError(
                    ErrorKind.INVALID,
                    "invalid_request",
                    f"after: {after!r} is not an input item of {response_id}",
                    [{"field": "after", "message": "not an input item of this response"}],
                )
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return InputItemList(
            data=page,
            first_id=page[0]["id"] if page else None,
            last_id=page[-1]["id"] if page else None,
            has_more=len(items) > limit,
        )

    # --- Conversation state ---------------------------------------------------------------------------------------

    def _conversation(self, tenant: str, request: ResponseCreate) -> list[Item]:
        """The items ``request`` runs: the history its ``previous_response_id`` names (the chain followed through each
        stored response's own), then its input, as its ``truncation`` leaves them."""
        turns: list[Turn] = []
        response_id, continued_by = request.previous_response_id, None
        while response_id is not None:
            if len(turns) == conversation.MAX_CHAIN:
                if request.truncation == "auto":
                    break  # the oldest responses: what truncation would drop first
                message = (
                    f"the conversation is more than {conversation.MAX_CHAIN} responses long; send truncation: 'auto' "
                    "to drop its oldest turns, or start a new conversation with the turns to keep in input"
                )
                raise ServiceError(
                    ErrorKind.INVALID, "invalid_request", f"previous_response_id: {message}", _field(message)
                )
            turns.append(self._turn(tenant, response_id, continued_by))
            response_id, continued_by = turns[-1].request.previous_response_id, response_id
        items = [*conversation.history(reversed(turns)), *request.items()]
        return conversation.truncated(request, items, self.models.limits_of(tenant))

    def _turn(self, tenant: str, response_id: str, continued_by: str | None) -> Turn:
        """A stored response of the conversation, completed (or cut at its token limit) with its output; 404 for an
        unknown, deleted or another tenant's id, 400 for one that has not completed."""
        which = response_id if continued_by is None else f"{response_id} (the previous response of {continued_by})"
        try:
            job, original = self._get(tenant, response_id)
        except ServiceError as exc:
            if exc.kind is not ErrorKind.NOT_FOUND:
                raise
            message = f"no response {which}: it is unknown or was deleted"
            raise ServiceError(
                ErrorKind.NOT_FOUND, "previous_response_not_found", f"previous_response_id: {message}", _field(message)
            ) from exc
        try:
            result = self._result(job)
        except ServiceError as exc:  # gone: its output is past the bucket's retention
            raise ServiceError(exc.kind, exc.code, f"previous_response_id: {exc.message}", _field(exc.message)) from exc
        if result is None:
            status = to_response(job, original).status
            message = f"response {which} is {status}; only a completed response can be continued" + (
                ": wait until it completes" if job.status not in FINAL_STATES else ""
            )
            raise ServiceError(
                ErrorKind.INVALID, "invalid_request", f"previous_response_id: {message}", _field(message)
            )
        return Turn(original, output_items(response_id, result)[0])

    # --- Reads ----------------------------------------------------------------------------------------------------

    def _get(self, tenant: str, response_id: str) -> tuple[Job, ResponseCreate]:
        """The tenant's response: its job and its Responses body; 404 alike for an unknown id, another tenant's, a
        deleted response and a job that is not a response."""
        not_found = ServiceError(ErrorKind.NOT_FOUND, "not_found", f"no response {response_id}")
        try:
            job = self.jobs.get(tenant, job_id_of(response_id))
        except (ValueError, ServiceError) as exc:
            if isinstance(exc, ServiceError) and exc.kind is not ErrorKind.NOT_FOUND:
                raise
            raise not_found from exc
        try:
            return job, self._original(job)
        except KeyError as exc:
            raise not_found from exc

    def _original(self, job: Job) -> ResponseCreate:
        body = self.blobs.get(
            settings.responses_request_key(job.tenant, job.job_id), max_bytes=settings.MAX_INLINE_REQUEST_BYTES * 2
        )
        return ResponseCreate.model_validate_json(body)

    def _result(self, job: Job) -> ChatCompletion | None:
        """The job's chat.completion once it has succeeded; 410 once the bucket's retention has deleted it."""
        if job.status is not JobStatus.SUCCEEDED or not job.result_key:
            return None
        expired = ServiceError(
            ErrorKind.GONE,
            "result_expired",
            f"the output of response {response_id_of(job.job_id)} expired: "
            f"results are kept {self.jobs.payload_retention_days} days after they are written",
        )
        if job.result_expires_at is not None and utcnow() >= job.result_expires_at:
            raise expired
        try:
            body = self.blobs.get(job.result_key, max_bytes=settings.MAX_UPLOAD_BYTES * 4)
        except KeyError as exc:
            raise expired from exc
        return ChatCompletion.model_validate_json(body)


def _field(message: str) -> list[dict[str, str]]:
    return [{"field": "previous_response_id", "message": message}]
