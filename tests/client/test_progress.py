"""The CLI's progress display: on a terminal a line that counts the job's tokens as it reports them, plain lines
elsewhere."""

from __future__ import annotations

import datetime as dt
import io

from async_inference_client import JobUpdate
from async_inference_client.cli import Progress
from async_inference_client.models.jobs import JobProgress, JobStatus, JobView
from tests.client.fake_api import JOB_ID, job_view

NOW = dt.datetime.now(dt.UTC)
USAGE = {"prompt_tokens": 5, "completion_tokens": 30, "total_tokens": 35}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_counts_the_reported_tokens_and_ends_with_the_usage():
    # GIVEN a terminal
    terminal = Terminal()
    progress = Progress(terminal)
    # WHEN the job starts, reports 12 tokens so far, then succeeds with 30 tokens of usage
    progress(JobUpdate(JOB_ID, JobStatus.RUNNING, via="push"))
    progress(
        JobUpdate(JOB_ID, JobStatus.RUNNING, progress=JobProgress(completion_tokens=12, updated_at=NOW), via="push")
    )
    at_12 = terminal.getvalue().split("\r")[-1]
    progress(JobUpdate(JOB_ID, JobStatus.SUCCEEDED, via="push"))
    progress(JobUpdate.of_view(JobView.model_validate(job_view("succeeded", usage=USAGE))))
    progress.done()
    # THEN the line showed the job, its status and its 12 tokens, and ended succeeded with the 30 the job generated
    assert JOB_ID in at_12 and "running" in at_12 and " 12 tokens" in at_12
    end = terminal.getvalue().rstrip("\n").split("\r")[-1]
    assert "succeeded" in end and " 30 tokens" in end and "%" not in end


def test_off_a_terminal_each_status_is_one_line():
    stream = io.StringIO()
    progress = Progress(stream)
    for status in ("queued", "queued", "running", "running", "succeeded"):
        progress(JobUpdate(JOB_ID, JobStatus(status)))
    progress.done()
    assert [line.split()[:2] for line in stream.getvalue().splitlines()] == [
        [JOB_ID, "queued"],
        [JOB_ID, "running"],
        [JOB_ID, "succeeded"],
    ]
    assert "\r" not in stream.getvalue()


def test_a_polled_running_job_reports_its_tokens_so_far():
    # GIVEN the API's view of a running job with its progress, as GET /v1/jobs/{id} returns it
    view = JobView.model_validate(
        job_view("running", progress={"completion_tokens": 7, "updated_at": "2026-12-01T10:00:05Z"})
    )
    # WHEN wait() turns it into an update THEN the update carries the tokens so far, not a fraction
    update = JobUpdate.of_view(view)
    assert update.progress is not None and update.progress.completion_tokens == 7
    assert update.progress.updated_at.isoformat() == "2026-12-01T10:00:05+00:00"
