"""GET /v1/jobs/{id} over HTTP on the local stack: how long to wait before the next poll (Retry-After) while a job is
unfinished, and 410 Gone once its result's retention is over.

Time passing is simulated by moving the job's own timestamps back in its DynamoDB item, as days or minutes would.
"""

from __future__ import annotations

import datetime as dt

import pytest
import requests

from async_inference import settings
from async_inference.aws import client
from async_inference.schemas import utcnow
from tests.e2e.conftest import chat

pytestmark = pytest.mark.e2e
KEY_A = {"x-api-key": "tenant-a-key-0123456789"}


def get(stack, job_id: str) -> requests.Response:
    return requests.get(f"{stack.api_url}/v1/jobs/{job_id}", headers=KEY_A, timeout=10)


def set_item(stack, job_id: str, **values: str) -> None:
    """Overwrite attributes of the job's item, as time passing would have written them."""
    client("dynamodb").update_item(
        TableName=stack.resources.config.table_name,
        Key={settings.TABLE_PARTITION_KEY: {"S": job_id}},
        UpdateExpression="SET " + ", ".join(f"#{k} = :{k}" for k in values),
        ExpressionAttributeNames={f"#{k}": k for k in values},
        ExpressionAttributeValues={f":{k}": {"S": v} for k, v in values.items()},
    )


def ago(seconds: float) -> str:
    return (utcnow() - dt.timedelta(seconds=seconds)).isoformat()


def test_an_unfinished_job_says_when_to_poll_again_from_its_state_and_age(stack, api):
    # GIVEN a job that was just queued (no worker runs here)
    job = api.submit(chat("poll me"))
    # WHEN it is read
    fresh = get(stack, job.job_id)
    # THEN it asks for the next poll in a second
    assert fresh.status_code == 200 and fresh.headers["Retry-After"] == "1"
    # AND once it has waited about a minute, in a fifth of that (57 s ago: 12 s for a read within 3 s)
    set_item(stack, job.job_id, updated_at=ago(57))
    assert get(stack, job.job_id).headers["Retry-After"] == "12"
    # AND never later than the cap, however long it waits
    set_item(stack, job.job_id, updated_at=ago(3600))
    assert get(stack, job.job_id).headers["Retry-After"] == str(settings.MAX_POLL_AFTER_S)
    # AND a final job has nothing to wait for
    api.cancel(job.job_id)
    assert "Retry-After" not in get(stack, job.job_id).headers


def test_a_result_past_its_retention_is_410_gone_with_a_message(stack, api, worker):
    # GIVEN a job that succeeded: its view carries the result URL and when the result expires
    job = api.wait(api.submit(chat("keep me a while")).job_id, timeout_s=60)
    assert job.status == "succeeded" and job.result is not None
    assert job.result_expires_at is not None
    assert job.result_expires_at - job.finished_at >= dt.timedelta(days=settings.PAYLOAD_RETENTION_DAYS)
    assert job.result.expires_at <= job.result_expires_at
    # AND its URL is signed for no longer than the functions' session credentials are trusted to last (an hour once)
    assert f"X-Amz-Expires={settings.SIGNED_URL_MAX_S}&" in str(job.result.url) and settings.SIGNED_URL_MAX_S <= 900
    # WHEN its retention has passed (the bucket's lifecycle deletes the object then)
    set_item(stack, job.job_id, result_expires_at=ago(1))
    response = get(stack, job.job_id)
    # THEN the read is a 410 that says the result is gone and when it went, not a URL to a missing object
    assert response.status_code == 410, response.text
    error = response.json()["error"]
    assert error["code"] == "result_expired"
    assert job.job_id in error["message"] and "expired" in error["message"]
