"""A background response's webhook (issue 20): its end is told as OpenAI's response.* webhook event, signed as every
webhook is, by the dispatcher that delivers job webhooks."""

from __future__ import annotations

import json

import pytest
from standardwebhooks import Webhook

from async_inference.jobs import JobStatus
from async_inference.schemas import ResultNotification, Timings, utcnow
from async_inference.schemas.responses import ResponseCreate
from async_inference.webhooks.delivery import PostResult
from async_inference.webhooks.events import RESPONSE_EVENTS
from tests.unit.test_webhooks_core import SECRET, FakePoster, FakeStore, dispatcher, make_job

JOB_ID = "job_" + "a" * 32
RESPONSE_ID = "resp_" + "a" * 32


def _notification(status: JobStatus, finish_reason: str | None = "stop") -> str:
    result = None
    if finish_reason is not None:
        result = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": finish_reason}
            ],
        }
    now = utcnow()
    return ResultNotification.model_validate(
        {
            "job_id": JOB_ID,
            "tenant": "t1",
            "status": status,
            "result": result,
            "timings": Timings(created_at=now, finished_at=now).model_dump(mode="json"),
        }
    ).model_dump_json(exclude_none=True)


@pytest.mark.parametrize(
    ("status", "finish_reason", "kind"),
    [
        (JobStatus.SUCCEEDED, "stop", "response.completed"),
        (JobStatus.SUCCEEDED, "length", "response.incomplete"),
        (JobStatus.FAILED, None, "response.failed"),
        (JobStatus.EXPIRED, None, "response.failed"),
        (JobStatus.CANCELLED, None, "response.cancelled"),
    ],
)
def test_a_responses_end_is_posted_as_openais_response_event_with_its_id(status, finish_reason, kind):
    # GIVEN a response's job whose webhook asked for the response events (as POST /v1/responses records it)
    job = make_job(events=list(RESPONSE_EVENTS), status=status)
    store, poster = FakeStore(job), FakePoster(PostResult(200))
    # WHEN its completed notification is dispatched
    outcome = dispatcher(store, poster).dispatch(_notification(status, finish_reason), receive_count=1)
    # THEN the receiver gets OpenAI's webhook event for the response, signed, its id the same on every send
    assert outcome.done and outcome.reason == "delivered"
    [(_, headers, body)] = poster.calls
    event = Webhook(SECRET).verify(body, headers)
    assert event["type"] == kind and event["object"] == "event" and event["data"] == {"id": RESPONSE_ID}
    assert headers["webhook-id"] == event["id"] == "evt_" + "a" * 32
    [(attempt, state)] = store.attempts
    assert attempt["event"] == kind and state == "delivered"


def test_a_response_event_not_asked_for_is_not_posted():
    # GIVEN a response whose webhook asked for response.failed only WHEN it completes THEN nothing is posted
    job = make_job(events=["response.failed"], status=JobStatus.SUCCEEDED)
    store, poster = FakeStore(job), FakePoster()
    assert dispatcher(store, poster).dispatch(_notification(JobStatus.SUCCEEDED), receive_count=1).done
    assert poster.calls == []


def test_a_plain_jobs_webhook_still_gets_the_job_notification():
    # GIVEN a job's webhook (completed) WHEN dispatched THEN the body is the job's notification, not a response event
    job = make_job(status=JobStatus.SUCCEEDED)
    store, poster = FakeStore(job), FakePoster(PostResult(200))
    dispatcher(store, poster).dispatch(_notification(JobStatus.SUCCEEDED), receive_count=1)
    assert json.loads(poster.calls[0][2])["job_id"] == JOB_ID


def test_the_responses_request_takes_a_webhook_whose_events_default_to_all_four():
    # GIVEN a background response with a webhook (the SDK's extra_body) WHEN parsed THEN all four events are asked for
    request = ResponseCreate.model_validate(
        {"model": "m", "input": "hi", "background": True, "webhook": {"url": "https://hooks.example.com/r"}}
    )
    assert request.webhook is not None and request.webhook.events == list(RESPONSE_EVENTS)
    with pytest.raises(ValueError, match="webhook"):
        ResponseCreate.model_validate(
            {
                "model": "m",
                "input": "hi",
                "background": True,
                "webhook": {"url": "https://h.example.com", "events": ["x"]},
            }
        )
