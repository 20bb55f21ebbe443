"""The corpus's real ``/v1/responses`` bodies (tests/conformance/corpus: 82 of them) against the Responses model: each
is accepted and converts to a chat request, or is refused by a validation error naming a field this service
documents as refused (docs/design/responses.md); none raises anything else."""

from __future__ import annotations

import json
from collections import Counter

from pydantic import ValidationError

from async_inference.responses import to_chat_request
from async_inference.schemas import error_location
from async_inference.schemas.responses import REFUSED, ResponseCreate
from tests.conformance.openai_reference import CORPUS, MODEL_PLACEHOLDER

RESPONSES = "/v1/responses"
# Refused fields besides REFUSED's: what a text-only job cannot do, and OpenAI's own refusal of a stateless
# background response. A path's first segment is enough (input.0.content.1 is a non-text part, tools.0 a hosted tool).
DOCUMENTED = set(REFUSED) | {"background", "store", "input", "tools", "include", "reasoning", "type"}


def _bodies(background: bool) -> list[dict]:
    bodies = []
    for text in CORPUS.read_text().splitlines():
        record = json.loads(text)
        if record["endpoint"] == RESPONSES:
            body = dict(record["body"])
            if body.get("model") == MODEL_PLACEHOLDER:
                body["model"] = "echo-model"
            if background:
                body["background"] = True
            bodies.append(body)
    return bodies


def _answers(background: bool) -> tuple[int, Counter[str]]:
    accepted, refused = 0, Counter()
    for body in _bodies(background):
        try:
            to_chat_request(ResponseCreate.model_validate_json(json.dumps(body)))
            accepted += 1
        except ValidationError as exc:
            refused[error_location(exc.errors()[0])] += 1
    return accepted, refused


def test_with_background_set_most_bodies_run_and_every_refusal_names_a_documented_field():
    # GIVEN the corpus's Responses bodies with background: true (what a client of this service sends)
    accepted, refused = _answers(background=True)
    # THEN more than half convert to a chat request, and each other one names a field this service refuses
    assert accepted + sum(refused.values()) == 82
    assert accepted >= 45, refused
    assert {field.split(".")[0] for field in refused} <= DOCUMENTED, refused


def test_as_sent_without_background_most_bodies_run_held_and_every_refusal_names_a_documented_field():
    # GIVEN the corpus's Responses bodies as sent (none sets background: each is held until its job ends)
    accepted, refused = _answers(background=False)
    # THEN more than half convert to a chat request, and each other one names a field this service refuses
    assert accepted >= 45 and "background" not in refused, refused
    assert {field.split(".")[0] for field in refused} <= DOCUMENTED, refused


def test_the_bodies_that_continue_a_stored_response_are_not_refused_for_it():
    # GIVEN the corpus's bodies that continue a response with previous_response_id (the ids are OpenAI's: the
    # service answers each with a 404 naming previous_response_id unless it names a response of the tenant's)
    continuing = [body for body in _bodies(background=False) if body.get("previous_response_id")]
    assert len(continuing) == 4
    # WHEN each is validated THEN none is refused for previous_response_id; those that ask nothing else the service
    # refuses (the SDK tests' bodies also send conversation, stream_options...) are accepted and convert
    accepted, refused = 0, []
    for body in continuing:
        try:
            to_chat_request(ResponseCreate.model_validate_json(json.dumps(body)))
            accepted += 1
        except ValidationError as exc:
            refused.append(error_location(exc.errors()[0]))
    assert "previous_response_id" not in refused and accepted >= 2, refused
