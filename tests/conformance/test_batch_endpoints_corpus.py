"""The corpus's real /v1/embeddings, /v1/completions and /v1/responses bodies (tests/conformance/corpus) as batch
lines, read as the worker reads a line (``BatchInputLine.request``): each is accepted (and a generating one converts to
the chat request the engine runs, within its cost bounds), or refused by a validation error naming a field; none
raises anything else. The counts are the measure docs/design/embeddings.md
quotes: a change in them is a change in what real clients get."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from pydantic import ValidationError

from async_inference.batches.lines import BatchInputLine
from async_inference.schemas import error_location
from tests.conformance.openai_reference import CORPUS, MODEL_PLACEHOLDER


def answers(endpoint: str) -> tuple[int, int, Counter[str]]:
    """(bodies, accepted, refusals by the first segment of the field named)."""
    total, accepted, refused = 0, 0, Counter()
    for text in CORPUS.read_text().splitlines():
        record = json.loads(text)
        if record["endpoint"] != endpoint:
            continue
        total += 1
        body = {**record["body"], "model": "m"} if record["body"].get("model") == MODEL_PLACEHOLDER else record["body"]
        line = BatchInputLine.model_validate({"custom_id": "c", "method": "POST", "url": endpoint, "body": body})
        try:
            line.request()
        except ValidationError as exc:
            refused[error_location(exc.errors()[0]).split(".")[0]] += 1
            continue
        accepted += 1
    return total, accepted, refused


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        # metadata is no field of OpenAI's embeddings request either
        ("/v1/embeddings", (21, 20, {"metadata": 1})),
        ("/v1/completions", (15, 8, {"stream": 3, "logit_bias": 2, "echo": 1, "prompt": 1})),
        # as batch lines: no background needed and store false dropped (docs/design/embeddings.md)
        (
            "/v1/responses",
            (
                82,
                53,
                {
                    "stream": 11,
                    "input": 6,
                    "tools": 4,
                    "conversation": 2,
                    "previous_response_id": 2,
                    "type": 1,
                    "reasoning": 1,
                    "include": 1,
                    "context_management": 1,
                },
            ),
        ),
    ],
)
def test_the_corpus_bodies_as_batch_lines_are_accepted_or_refused_naming_a_field(endpoint, expected):
    total, accepted, refused = answers(endpoint)
    assert (total, accepted, dict(refused)) == expected
