"""The CLI's progress display: a bar on a terminal that fills as the job reports progress, plain lines elsewhere."""

from __future__ import annotations

import io

from async_inference.cli import Progress
from async_inference.client import JobUpdate
from async_inference.jobs import JobStatus
from tests.client.fake_api import JOB_ID


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_fills_with_the_reported_progress_and_ends_full():
    # GIVEN a terminal
    terminal = Terminal()
    progress = Progress(terminal)
    # WHEN the job starts, reports 40 %, then succeeds
    progress(JobUpdate(JOB_ID, JobStatus.RUNNING, via="push"))
    progress(JobUpdate(JOB_ID, JobStatus.RUNNING, progress=0.4, via="push"))
    at_40 = terminal.getvalue().split("\r")[-1]
    progress(JobUpdate(JOB_ID, JobStatus.SUCCEEDED, via="push"))
    progress.done()
    # THEN the bar showed the job, its status and 40 %, and ended at 100 % succeeded
    assert JOB_ID in at_40 and "running" in at_40 and " 40%" in at_40
    end = terminal.getvalue().rstrip("\n").split("\r")[-1]
    assert "succeeded" in end and "100%" in end


def test_off_a_terminal_each_status_is_one_line():
    stream = io.StringIO()
    progress = Progress(stream)
    for status in ("queued", "queued", "running", "running", "succeeded"):
        progress(JobUpdate(JOB_ID, JobStatus(status)))
    progress.done()
    assert [line.split()[:2] for line in stream.getvalue().splitlines()] == [
        [JOB_ID, "queued"], [JOB_ID, "running"], [JOB_ID, "succeeded"]]
    assert "\r" not in stream.getvalue()
