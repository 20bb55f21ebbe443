"""A claim check that reached a dead-letter queue: its job failed and notified, once."""

from __future__ import annotations

from pydantic import ValidationError

from async_inference.aws import JobStore
from async_inference.jobs import FINAL_STATES, JobStatus
from async_inference.jobs_service.outcomes import JobOutcomes
from async_inference.jobs_service.shared import NotAClaimCheck, describe_validation_error
from async_inference.schemas import ClaimCheck, Job


class DeadLetters:
    """Fails the job of each dead-lettered claim check (or re-sends the notification of one already final)."""

    def __init__(self, *, store: JobStore, outcomes: JobOutcomes) -> None:
        self.store = store
        self.outcomes = outcomes

    def dead_letter(self, body: str, receive_count: int) -> Job | None:
        """A claim check reached the DLQ: fail its job (if it is not final yet) and notify. None when its job is gone;
        NotAClaimCheck when the message is not a claim check."""
        try:
            claim = ClaimCheck.model_validate_json(body)
        except ValidationError as exc:
            message, _ = describe_validation_error(exc)
            raise NotAClaimCheck(message) from exc
        job = self.store.get(claim.job_id)
        if job is None:
            return None
        if job.status in FINAL_STATES:
            if not job.notified:
                self.outcomes.notify(job)
            return job
        return self.outcomes.finish(job, JobStatus.FAILED, error=f"dead-lettered after {receive_count} attempts")
