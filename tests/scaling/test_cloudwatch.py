"""CloudWatch semantics: datapoints from minute samples, alarm evaluation, missing data, metric math."""

from __future__ import annotations

import pytest

from bench.scaling.cloudwatch import (
    ALARM,
    INSUFFICIENT,
    OK,
    Alarm,
    MetricId,
    MetricQuery,
    MetricStat,
    MetricStore,
    Sources,
    evaluate_expression,
)

M = MetricId("Test", "Depth")


def _alarm(n: int = 3, m: int | None = None, missing: str = "missing", period: int = 60) -> Alarm:
    query = MetricQuery({"m1": MetricStat(M, "Maximum", period)})
    return Alarm(
        "a",
        query,
        threshold=1,
        comparison="GreaterThanOrEqualToThreshold",
        evaluation_periods=n,
        datapoints_to_alarm=m or n,
        treat_missing=missing,
        actions=("p",),
    )


def _run(values: dict[int, float | None], alarm: Alarm, minutes: int) -> list[tuple[int, str, bool]]:
    """Sample the gauge each minute (value by minute, None = not published) and evaluate the alarm after it."""
    now = {"minute": 0}
    store = MetricStore(Sources({M: lambda: values.get(now["minute"], 0.0)}))
    out = []
    for minute in range(1, minutes + 1):
        now["minute"] = minute
        store.sample(minute * 60.0)
        fire, _ = alarm.evaluate(store, minute * 60.0)
        out.append((minute, alarm.state, fire))
    return out


def test_three_period_alarm_fires_at_the_third_breaching_minute():
    # GIVEN a 3-of-3 alarm and a gauge breaching from the minute ending at 3:00
    states = _run({3: 5, 4: 5, 5: 5, 6: 5}, _alarm(3), 6)
    # WHEN evaluated each minute THEN it goes to ALARM at 5:00 (datapoints of minutes 3, 4, 5) and acts there
    assert [s for _, s, _ in states] == [OK, OK, OK, OK, ALARM, ALARM]
    assert [m for m, _, fire in states if fire] == [5, 6]


def test_m_of_n_alarm_needs_m_breaching_points_not_consecutive():
    # GIVEN a 2-of-3 alarm WHEN breaches fall on minutes 2 and 4 THEN it alarms at 4 (2 of the last 3), not before
    states = _run({2: 5, 3: 0, 4: 5}, _alarm(3, 2), 4)
    assert [s for _, s, _ in states] == [OK, OK, OK, ALARM]


@pytest.mark.parametrize(
    "points, missing, expected",
    [
        # Rows of the CloudWatch User Guide's table (3 of 3; 5 datapoints retrieved; 0 ok, X breaching, - missing).
        ("0-X-X", "breaching", OK),
        ("0----", "breaching", OK),
        ("-----", "breaching", ALARM),
        ("-----", "notBreaching", OK),
        ("-----", "missing", INSUFFICIENT),
        ("0XX-X", "missing", ALARM),
        ("----X", "breaching", ALARM),
        ("----X", "missing", INSUFFICIENT),
    ],
)
def test_missing_data_treatment_follows_the_documented_table(points, missing, expected):
    # GIVEN an evaluation range of five datapoints WHEN the alarm decides THEN the state is the documented one
    alarm = _alarm(3, missing=missing)
    values = [None if c == "-" else (5.0 if c == "X" else 0.0) for c in points]
    state, _ = alarm.decide(values)
    assert state == expected


def test_a_five_minute_period_takes_the_statistic_over_five_samples():
    # GIVEN a 5-minute Maximum WHEN one minute of five holds 7 THEN the period's datapoint is 7
    store = MetricStore(Sources({M: lambda: samples.pop(0)}))
    samples = [0.0, 7.0, 0.0, 0.0, 0.0]
    for minute in range(1, 6):
        store.sample(minute * 60.0)
    assert store.datapoint(MetricStat(M, "Maximum", 300), period_end=300.0, now=300.0) == 7.0
    assert store.datapoint(MetricStat(M, "Average", 300), period_end=300.0, now=300.0) == pytest.approx(1.4)


def test_a_datapoint_is_not_there_before_its_publication_delay():
    # GIVEN a metric published 90 s after its period WHEN queried at 60 s and at 150 s THEN missing, then there
    store = MetricStore(Sources({M: lambda: 3.0}, publication_delay_s=lambda metric: 90.0))
    store.sample(60.0)
    assert store.datapoint(MetricStat(M, "Maximum", 60), 60.0, now=60.0) is None
    assert store.datapoint(MetricStat(M, "Maximum", 60), 60.0, now=150.0) == 3.0


def test_metric_math_expressions():
    # GIVEN the expressions the policies use WHEN evaluated THEN CloudWatch's results, missing propagating
    assert (
        evaluate_expression("CEIL((visible + inFlight) / 16) - desired", {"visible": 20, "inFlight": 13, "desired": 1})
        == 2
    )
    assert (
        evaluate_expression(
            "IF(instances == 0 AND (visible + inFlight) > 0, 1, 0)", {"instances": 0, "visible": 1, "inFlight": 0}
        )
        == 1
    )
    assert evaluate_expression("visible + inFlight", {"visible": None, "inFlight": 2}) is None
    assert (
        evaluate_expression("(visible + inFlight) / instances", {"visible": 3, "inFlight": 2, "instances": 0}) is None
    )
    with pytest.raises(ValueError, match="unknown id"):
        evaluate_expression("visible + other", {"visible": 1})


def test_fill_stands_a_number_in_for_a_missing_metric_only():
    # GIVEN Container Insights publishing no DesiredTaskCount for a service without tasks WHEN the scale-out
    # expression reads it through FILL THEN the missing count is 0 and a present one is kept
    expression = "CEIL((visible + inFlight) / 202.5) - FILL(desired, 0)"
    assert evaluate_expression(expression, {"visible": 1, "inFlight": 0, "desired": None}) == 1
    assert evaluate_expression(expression, {"visible": 1, "inFlight": 0, "desired": 1}) == 0
    assert (
        evaluate_expression(
            "FILL(desired, 0) - IF((visible + inFlight) > 0, CEIL((visible + inFlight) / 8), 1)",
            {"visible": 0, "inFlight": 0, "desired": 3},
        )
        == 2
    )
