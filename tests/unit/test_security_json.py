"""The one JSON loader for what callers send (async_inference.safe_json), and the core parsers that use it: hostile
nesting and numbers are refused with a message naming the limit, never a RecursionError or a bare ValueError."""

from __future__ import annotations

import json

import pytest

from async_inference import safe_json
from async_inference.batches import planning
from async_inference.jobs_service import parse_request_body
from async_inference.served_models import ServedModels

DEEP = "[" * 50_000 + "]" * 50_000
DEEP_OBJECT = '{"a":' * 50_000 + "1" + "}" * 50_000
HUGE_INT = "1" * 5_000


def request(**changes) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **changes}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (DEEP, "nested deeper than 64 levels"),
        (DEEP_OBJECT, "nested deeper than 64 levels"),
        ('{"a":' * 65 + "1" + "}" * 65, "nested deeper than 64 levels (at ...a.a"),
        (f'{{"n": {HUGE_INT}}}', "number of more than 100 digits"),
        ('{"n": [' + "9" * 101 + "]}", "number of more than 100 digits (at n[0])"),
        ('{"n": 1e400}', "beyond the range of a double (at n)"),
        ('{"n": NaN}', "not valid JSON"),
        ("{not json", "not valid JSON"),
    ],
)
def test_hostile_or_broken_json_is_refused_with_what_is_wrong(text, says):
    # GIVEN input a caller sent WHEN it is loaded THEN it is refused as a JSONDecodeError that says what is wrong
    with pytest.raises(json.JSONDecodeError) as refused:
        safe_json.loads(text)
    assert says in str(refused.value)


def test_json_within_the_limits_loads_as_json_loads_it():
    # GIVEN a request 64 levels deep at most, with int64 and float numbers
    text = json.dumps({"a": [1, -(2**63), 1.5e300, True, None, "x"], "deep": json.loads("[" * 63 + "]" * 63)})
    # WHEN loaded THEN the value is the one json.loads reads
    assert safe_json.loads(text) == json.loads(text)
    assert safe_json.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"model": "m", "messages": [], "metadata": ' + DEEP_OBJECT + "}", "nested deeper than 64 levels"),
        ('{"model": "m", "messages": [], "seed": ' + HUGE_INT + "}", "number of more than 100 digits"),
        ('{"model": "m", "messages": ' + DEEP + "}", "nested deeper than 64 levels"),
    ],
)
def test_an_uploaded_request_of_hostile_json_fails_with_the_reason(body, reason):
    # GIVEN an uploaded request body of hostile JSON WHEN the upload is checked THEN it is refused with a reason
    parsed, why = parse_request_body(body.encode())
    assert parsed is None and why.startswith("the body is refused: ") and reason in why


def test_a_batch_line_of_hostile_json_fails_the_plan_naming_the_line():
    # GIVEN a batch input whose second line nests 50,000 deep and third holds a 5,000-digit number
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": request()})
    huge = good.replace('"custom_id": "a"', f'"custom_id": "c", "n": {HUGE_INT}')
    data = f"{good}\n{DEEP}\n{huge}\n".encode()
    # WHEN it is planned
    found = planning.plan([data], served=ServedModels.of(None))
    # THEN each line is an error naming it and the limit (no RecursionError), and nothing is chunked
    assert [(e.code, e.line) for e in found.errors] == [("invalid_json_line", 2), ("invalid_json_line", 3)]
    assert "line 2: JSON nested deeper than 64 levels" in found.errors[0].message
    assert "line 3: a JSON number of more than 100 digits" in found.errors[1].message
    assert found.chunks == []
