"""The wire schemas validate what the API contract promises."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import ValidationError

from async_inference import settings
from async_inference.schemas import ChatCompletionRequest, ClaimCheck, JobSubmission

MESSAGES = [{"role": "user", "content": "hi"}]


def test_defaults_follow_openai_and_the_shared_settings():
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES})
    assert (request.max_tokens, request.temperature, request.top_p, request.n) == (settings.DEFAULT_MAX_TOKENS, 1.0, 1.0, 1)


@pytest.mark.parametrize(
    "change",
    [{"max_tokens": "5"}, {"max_tokens": 5.0}, {"temperature": 2.5}, {"top_p": 0}, {"n": 2}, {"seed": -1},
     {"stop": ""}, {"logprobs": True}, {"messages": [{"role": "user"}]}],
)
def test_invalid_or_unknown_request_fields_are_rejected(change):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate_json(
            __import__("json").dumps({"model": "m", "messages": MESSAGES, **change})
        )


def test_stop_accepts_a_string_or_a_list_and_normalises_to_a_list():
    assert ChatCompletionRequest(model="m", messages=MESSAGES, stop="\n").stop_sequences == ["\n"]
    assert ChatCompletionRequest(model="m", messages=MESSAGES, stop=["a", "b"]).stop_sequences == ["a", "b"]


def test_submission_needs_exactly_one_of_request_and_upload():
    with pytest.raises(ValidationError, match="exactly one"):
        JobSubmission.model_validate({"metadata": {}})
    with pytest.raises(ValidationError, match="exactly one"):
        JobSubmission.model_validate({"request": {"model": "m", "messages": MESSAGES}, "upload": {"size_bytes": 1}})


def test_metadata_is_bounded():
    too_many = {f"k{i}": "v" for i in range(settings.MAX_METADATA_KEYS + 1)}
    with pytest.raises(ValidationError):
        JobSubmission.model_validate({"upload": {"size_bytes": 1}, "metadata": too_many})


def test_claim_check_is_versioned_and_small():
    claim = ClaimCheck(job_id="job_" + "a" * 32, tenant="t" * 64, bucket="b" * 63, key="k" * 200, model="m" * 256,
                       deadline=dt.datetime.now(dt.timezone.utc), timeout_s=600)
    body = claim.model_dump_json()
    assert '"schema_version":"1"' in body
    assert len(body.encode()) < 1024


def test_claim_check_refuses_a_malformed_job_id():
    with pytest.raises(ValidationError):
        ClaimCheck(job_id="job_x", tenant="t", bucket="b", key="k", deadline=dt.datetime.now(dt.timezone.utc), timeout_s=1)
