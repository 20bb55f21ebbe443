"""The inbox (async_inference.inbox): which object becomes what, and a batch taken in once, never lost."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from async_inference.inbox import ClaimInProgress, InboxIntake, InboxRule, chat_request, rule_for
from async_inference.schemas import utcnow

RULE = InboxRule(prefix="docs/", tenant="t1", model="m")


def test_the_longest_matching_prefix_is_the_rule_and_a_key_outside_every_prefix_has_none():
    nested = InboxRule(prefix="docs/legal/", tenant="t2", model="m")
    assert rule_for([RULE, nested], "inbox/docs/legal/a.txt") is nested
    assert rule_for([RULE, nested], "inbox/docs/a.txt") is RULE
    assert rule_for([RULE], "docs/a.txt") is None and rule_for([RULE], "inbox/other/a.txt") is None


def test_a_chat_body_runs_as_it_is_and_anything_else_is_the_user_message_of_the_rules_model():
    body = chat_request(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}', RULE)
    assert (body.model, body.max_tokens) == ("m", 5)
    text = chat_request("résumé, please".encode(), RULE)
    assert (text.model, text.messages[0].content) == ("m", "résumé, please")
    for bad, reason in ((b"\xff\xfe", "neither"), (b"  ", "empty"), (b'{"messages": "x"}', "schema refuses")):
        with pytest.raises(ValueError, match=reason):
            chat_request(bad, RULE)


class Blobs:
    """The claim-check bucket's markers: a conditional PUT, a PUT, and LastModified."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.written: dict[str, dt.datetime] = {}

    def put_json_once(self, key: str, body: bytes) -> bytes | None:
        if key in self.objects:
            return self.objects[key]
        self.put_json(key, body)
        return None

    def put_json(self, key: str, body: bytes) -> None:
        self.objects[key], self.written[key] = body, utcnow()

    def written_at(self, key: str) -> dt.datetime | None:
        return self.written.get(key)


class Batches:
    """BatchService's parts the inbox uses: a new file record, its copy and record, the batch."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.files = SimpleNamespace(copy=lambda source, target: None)
        self.store = SimpleNamespace(create=lambda record: None)

    def _new_file(self, tenant: str, *, filename: str, purpose: str, size: int):
        return SimpleNamespace(id=f"file-{len(self.created):024x}", key=f"files/{tenant}/f/content")

    def create_batch(self, tenant: str, create):
        self.created.append(create.input_file_id)
        return SimpleNamespace(id=f"batch_{len(self.created)}")


def _intake(blobs: Blobs, batches: Batches) -> InboxIntake:
    return InboxIntake(rules=[RULE], jobs=SimpleNamespace(blobs=blobs), batches=batches)


def test_a_jsonl_becomes_one_batch_and_its_redelivery_creates_none():
    blobs, batches = Blobs(), Batches()
    first = _intake(blobs, batches).accept("inbox/docs/n.jsonl", 100, "etag-1")
    again = _intake(blobs, batches).accept("inbox/docs/n.jsonl", 100, "etag-1")
    assert first.batch_id == "batch_1" and again.batch_id is None and "batch_1" in (again.reason or "")
    assert len(batches.created) == 1
    # A new version of the object (another ETag) is a new batch.
    assert _intake(blobs, batches).accept("inbox/docs/n.jsonl", 100, "etag-2").batch_id == "batch_2"


def test_a_claim_left_by_an_invocation_that_died_before_its_batch_is_taken_over_not_lost():
    # GIVEN the object's claim written by an invocation that ended before creating the batch (no batch id in it)
    blobs, batches = Blobs(), Batches()
    intake = _intake(blobs, batches)
    intake.batches = SimpleNamespace(
        _new_file=batches._new_file, files=batches.files, store=batches.store, create_batch=_crash
    )
    with pytest.raises(ConnectionError):
        intake.accept("inbox/docs/n.jsonl", 100, "etag-1")
    # WHEN the event comes again at once THEN it is retried later (the claim may still be in progress)
    with pytest.raises(ClaimInProgress):
        _intake(blobs, batches).accept("inbox/docs/n.jsonl", 100, "etag-1")
    # WHEN it comes again after the function's timeout THEN this invocation takes the object in
    [marker] = blobs.written
    blobs.written[marker] = utcnow() - dt.timedelta(minutes=3)
    taken = _intake(blobs, batches).accept("inbox/docs/n.jsonl", 100, "etag-1")
    assert taken.batch_id == "batch_1" and json.loads(blobs.objects[marker])["batch_id"] == "batch_1"


def _crash(tenant, create):
    raise ConnectionError("DynamoDB is down")
