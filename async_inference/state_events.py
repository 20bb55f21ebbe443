"""EventBridge events for job and batch state changes: what the notifications already say, as PutEvents entries.

The state-events function (cdk/state_events.py) is subscribed to the result topic (a job's final state,
``job.completed``; a batch's end, ``batch.*``) and to the job event topic (``job.started``); each notification becomes
one event on the stack's bus (the account's default bus), so that rules can route them to any target without
polling. Source ``SOURCE``; ``detail-type`` one per state (``DETAIL_TYPES``); ``detail`` the notification's own
fields, without an inline result (an event holds at most 256 KB; the result's location is there).
"""

from __future__ import annotations

import json
from typing import Any

from async_inference import settings

SOURCE = "async-inference"
# detail-type per state: a rule matches one state with {"detail-type": ["Job Succeeded"]}, all with a prefix.
DETAIL_TYPES = {
    "started": "Job Started",
    "succeeded": "Job Succeeded",
    "failed": "Job Failed",
    "cancelled": "Job Cancelled",
    "expired": "Job Expired",
    "batch.completed": "Batch Completed",
    "batch.failed": "Batch Failed",
    "batch.expired": "Batch Expired",
    "batch.cancelled": "Batch Cancelled",
}
PUT_EVENTS_ENTRIES = 10  # PutEvents' most entries a call


def entry_of(message: str, attributes: dict[str, str], bus: str) -> dict[str, Any] | None:
    """The PutEvents entry for one notification (its body and message attributes), or None for what is no state
    change (progress) or not ours."""
    event = attributes.get(settings.EVENT_ATTRIBUTE)
    try:
        body = json.loads(message)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if event == settings.RESULT_EVENT:
        state = str(body.get("status", ""))
        detail = {k: v for k, v in body.items() if k != "result"}  # the location stays; the bytes do not
    elif event == "job.started":
        state, detail = "started", body
    elif event in settings.BATCH_RESULT_EVENTS:
        state = event
        detail = {"id": body.get("data", {}).get("id"), "tenant": body.get("tenant"), "batch": body.get("batch")}
    else:
        return None
    if state not in DETAIL_TYPES:
        return None
    return {"Source": SOURCE, "DetailType": DETAIL_TYPES[state], "Detail": json.dumps(detail), "EventBusName": bus}


def put_all(events: Any, entries: list[dict[str, Any]]) -> int:
    """PutEvents ``entries`` (an ``events`` client), 10 a call; the entries EventBridge failed, which the caller
    raises on, so that SNS retries the invocation (a consumer may see an event twice, never none)."""
    failed = 0
    for start in range(0, len(entries), PUT_EVENTS_ENTRIES):
        answer = events.put_events(Entries=entries[start : start + PUT_EVENTS_ENTRIES])
        failed += int(answer.get("FailedEntryCount", 0))
    return failed
