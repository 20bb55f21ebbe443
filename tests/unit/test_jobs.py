"""The job state machine and ids: pure, no AWS."""

from __future__ import annotations

import pytest

from async_inference.jobs import FINAL_STATES, JobStatus, is_job_id, new_job_id, sources_of


@pytest.mark.parametrize("final", sorted(FINAL_STATES, key=lambda s: s.value))
def test_no_transition_leaves_a_final_state(final):
    for target in JobStatus:
        if target is JobStatus.AWAITING_UPLOAD:
            continue  # nothing ever enters awaiting_upload: it is only a starting state
        assert final not in sources_of(target)


def test_a_redelivered_running_job_may_run_again_but_a_queued_one_cannot_succeed_without_running():
    assert JobStatus.RUNNING in sources_of(JobStatus.RUNNING)
    assert JobStatus.QUEUED not in sources_of(JobStatus.SUCCEEDED)


def test_only_jobs_that_have_not_started_can_expire():
    assert sources_of(JobStatus.EXPIRED) == {JobStatus.AWAITING_UPLOAD, JobStatus.QUEUED}


def test_cancel_is_allowed_from_every_unfinished_state():
    assert sources_of(JobStatus.CANCELLED) == set(JobStatus) - FINAL_STATES


def test_idempotency_key_maps_to_one_id_per_tenant():
    assert new_job_id("a", "key") == new_job_id("a", "key")
    assert new_job_id("a", "key") != new_job_id("b", "key")
    assert new_job_id("a") != new_job_id("a")


@pytest.mark.parametrize("value", ["job_" + "0" * 31, "job_" + "g" * 32, "JOB_" + "0" * 32, "../job", ""])
def test_malformed_ids_are_refused(value):
    assert not is_job_id(value)


def test_generated_ids_have_the_documented_shape():
    assert is_job_id(new_job_id("t")) and is_job_id(new_job_id("t", "k"))
