"""A queue body parses once into the one union of claims: a job's claim check (with or without a kind), a batch chunk,
an unknown kind (left for a worker that knows it) and poison (not a claim at all)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from async_inference.aws import QueueMessage
from async_inference.schemas import ChunkClaimCheck, ClaimCheck, EmbeddingClaimCheck, Job, JobStatus
from gpu_worker.claims import Action, InFlight, Outcome, UnknownKind, parse_claim

DEADLINE = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
JOB = ClaimCheck(job_id="job_" + "a" * 32, tenant="t", bucket="b", key="k", deadline=DEADLINE, timeout_s=60)
CHUNK = ChunkClaimCheck(
    batch_id="batch_1",
    tenant="t",
    bucket="b",
    input_key="in",
    chunk=2,
    start_byte=0,
    end_byte=99,
    first_line=201,
    line_count=100,
    deadline=DEADLINE,
    timeout_s=60,
)


def test_a_claim_check_as_producers_write_it_without_a_kind_is_a_job():
    # GIVEN a job's claim check as the API sends it (no kind field)
    body = JOB.model_dump_json(exclude_none=True)
    assert "kind" not in json.loads(body)
    # WHEN it is parsed THEN it is the job's claim check, one engine request
    claim = parse_claim(body)
    assert claim == JOB
    flight = InFlight(QueueMessage("m", "r", body, 1), claim=claim)
    assert (flight.ident, flight.job_id, flight.lines) == (JOB.job_id, JOB.job_id, 1)


def test_a_claim_check_written_before_rows_existed_reads_as_one_row_and_a_newer_one_as_its_rows():
    # GIVEN a claim check without rows (written before they existed) and one of a request with n 8
    old = JOB.model_dump(mode="json", exclude={"rows"})
    assert "rows" not in old
    wide = JOB.model_copy(update={"rows": 8}).model_dump_json()
    # WHEN each is parsed THEN the old one holds one engine row, the new one its 8
    rows = [InFlight(QueueMessage("m", "r", body, 1), claim=parse_claim(body)).rows for body in (json.dumps(old), wide)]
    assert rows == [1, 8]


def test_a_chunk_claim_check_is_a_chunk_standing_for_its_lines():
    claim = parse_claim(CHUNK.model_dump_json())
    assert claim == CHUNK
    flight = InFlight(QueueMessage("m", "r", "", 1), claim=claim)
    assert (flight.ident, flight.job_id, flight.lines) == ("batch_1/2", None, 100)


def test_an_embeddings_jobs_claim_check_has_its_own_kind_and_is_a_job():
    # GIVEN an embeddings job as the store holds it (JobSubmission.endpoint /v1/embeddings)
    now = dt.datetime.now(dt.UTC)
    job = Job(
        job_id=JOB.job_id,
        tenant="t",
        status=JobStatus.QUEUED,
        created_at=now,
        updated_at=now,
        request_bucket="b",
        request_key="k",
        deadline=DEADLINE,
        timeout_s=60,
        endpoint="/v1/embeddings",
    )
    # WHEN its claim check is sent and parsed
    body = job.claim_check().model_dump_json(exclude_none=True)
    claim = parse_claim(body)
    # THEN it says its kind, and the worker holds it as the job it is
    assert json.loads(body)["kind"] == "embedding" and isinstance(claim, EmbeddingClaimCheck)
    flight = InFlight(QueueMessage("m", "r", body, 1), claim=claim)
    assert (flight.ident, flight.job_id, flight.lines) == (JOB.job_id, JOB.job_id, 1)


def test_a_kind_this_worker_does_not_know_is_told_apart_from_poison():
    # GIVEN a body of a kind a newer producer sends (a rolling deploy), and bodies that are no claim at all
    newer = json.dumps({"kind": "transcription", "job_id": JOB.job_id})
    # THEN the first is an UnknownKind (left for another worker), the others plain ValueErrors (deleted as poison)
    with pytest.raises(UnknownKind, match="'transcription' is not one of"):
        parse_claim(newer)
    for poison in ("not json", "[1, 2]", json.dumps({"job_id": "job_x"}), json.dumps({"kind": "batch_chunk"})):
        with pytest.raises(ValueError) as caught:
            parse_claim(poison)
        assert not isinstance(caught.value, UnknownKind), poison


def test_outcomes_say_what_the_pump_does():
    assert Outcome.delete().action is Action.DELETE
    assert (Outcome.retry(7).action, Outcome.retry(7).retry_in_s) == (Action.RETRY, 7)
    assert Outcome.retry(-3).retry_in_s == 0
    assert Outcome.hand_back().action is Action.HAND_BACK and Outcome.leave().action is Action.LEAVE
