"""CloudWatch as the scaling loop sees it: metrics published as one datapoint a period, and alarms evaluated on them.

Metrics. A *source* gives a metric's value at an instant (a gauge such as ApproximateNumberOfMessagesVisible) or its
count over an interval (NumberOfMessagesSent). Gauges are sampled once a minute, at the minute's end; a period's
datapoint is the statistic over its samples. A datapoint exists only if the source publishes for that period (SQS
publishes nothing for an inactive queue) and is visible to alarms ``publication_delay_s`` after the period ends.

Alarms. Every minute an alarm fetches its *evaluation range* (the evaluation periods plus two), then, as the CloudWatch
User Guide describes: with at least ``EvaluationPeriods`` datapoints present it evaluates the most recent ones; with
fewer, it fills the gap with the missing-data treatment, using missing points as few times as possible; ALARM when at
least ``DatapointsToAlarm`` of the evaluated points breach. With ``missing`` or ``ignore`` and too few points, any
non-breaching point makes it OK, none at all leaves INSUFFICIENT_DATA (missing) or the state as it was (ignore).
An alarm in ALARM invokes its Auto Scaling actions again every period.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.scaling.figures import EVALUATION_RANGE_EXTRA_PERIODS

OK, ALARM, INSUFFICIENT = "OK", "ALARM", "INSUFFICIENT_DATA"
SAMPLE_INTERVAL_S = 60
# "Except for Auto Scaling actions, the actions happen only on state transitions, and are not performed again if the
# condition persists" (CloudWatch User Guide, "Alarm actions"): an alarm in ALARM re-runs its Auto Scaling actions every
# period. False only for the counterfactual sensitivity row (actions on the transition into ALARM only).
RERUN_ACTIONS_IN_ALARM = True
# Whether FILL(m, v) gives v for a period in which no input of the expression has a datapoint (not published yet, or
# nothing published): the reading under which "FILL(m, 0)" keeps an alarm out of INSUFFICIENT_DATA, as it is commonly
# used. The documentation does not settle it; False is the other reading (metric math aligns on its inputs'
# timestamps), a sensitivity row.
FILL_WITHOUT_DATA = True


@dataclass(frozen=True)
class MetricId:
    namespace: str
    name: str
    # Which resource, when it is not the one the simulator models (the job queue, the worker service): another
    # queue's logical id, say. The simulated trace puts no work there.
    resource: str = ""


@dataclass(frozen=True)
class MetricStat:
    """A metric with the statistic and period a query asks of it."""

    metric: MetricId
    stat: str
    period_s: int


class Sources:
    """What each metric reads. ``gauges`` give the value now, ``counters`` the count in an interval; either returns
    None when the source publishes nothing (an inactive SQS queue, a service without running tasks).
    ``publication_delay_s(metric)``: how long after its period a datapoint reaches CloudWatch."""

    def __init__(
        self,
        gauges: Mapping[MetricId, Callable[[], float | None]],
        counters: Mapping[MetricId, Callable[[float, float], float | None]] | None = None,
        publication_delay_s: Callable[[MetricId], float] | None = None,
    ) -> None:
        self.gauges = dict(gauges)
        self.counters = dict(counters or {})
        self._delay = publication_delay_s or (lambda metric: 0.0)

    def knows(self, metric: MetricId) -> bool:
        return metric in self.gauges or metric in self.counters

    def delay(self, metric: MetricId) -> float:
        return self._delay(metric)


class MetricStore:
    """Samples every gauge once a minute and answers datapoint queries from the samples."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._samples: dict[MetricId, dict[int, float | None]] = {m: {} for m in sources.gauges}

    def sample(self, now: float) -> None:
        """Record each gauge's value at ``now`` (called at every minute's end)."""
        minute = int(round(now / SAMPLE_INTERVAL_S))
        for metric, read in self.sources.gauges.items():
            value = read()
            self._samples[metric][minute] = None if value is None else float(value)

    def datapoint(self, query: MetricStat, period_end: float, now: float) -> float | None:
        """The statistic over ``[period_end - period, period_end)``, or None when it is not (yet) published."""
        metric = query.metric
        start = period_end - query.period_s
        if now < period_end + self.sources.delay(metric):
            return None
        if metric in self.sources.counters:
            return self.sources.counters[metric](start, period_end)
        samples = self._samples.get(metric)
        if samples is None:
            raise KeyError(f"no source for metric {metric.namespace}/{metric.name}")
        first = int(round(start / SAMPLE_INTERVAL_S)) + 1
        last = int(round(period_end / SAMPLE_INTERVAL_S))
        values = [v for v in (samples.get(m) for m in range(first, last + 1)) if v is not None]
        if not values:
            return None
        return aggregate(query.stat, values)


def aggregate(stat: str, values: Sequence[float]) -> float:
    if stat == "Maximum":
        return max(values)
    if stat == "Minimum":
        return min(values)
    if stat == "Sum":
        return sum(values)
    if stat == "Average":
        return sum(values) / len(values)
    if stat == "SampleCount":
        return float(len(values))
    raise ValueError(f"statistic {stat!r} is not modelled (Maximum, Minimum, Sum, Average, SampleCount)")


# --- Metric math ------------------------------------------------------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_COMPARE = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def _translate(expression: str) -> str:
    # CloudWatch writes logical operators as AND/OR/&&/||; Python parses and/or.
    text = expression.replace("&&", " and ").replace("||", " or ")
    return " ".join(" and " if w == "AND" else " or " if w == "OR" else w for w in text.split(" "))


def evaluate_expression(expression: str, values: Mapping[str, float | None]) -> float | None:
    """A CloudWatch metric math expression over one period's values (arithmetic, comparisons, AND/OR, IF, CEIL, FLOOR,
    ABS, MIN, MAX of two, FILL with a number). A missing input or a division by zero makes the result missing, as in
    CloudWatch; FILL(m, v) is v where m is missing."""
    tree = ast.parse(_translate(expression), mode="eval")

    def walk(node: ast.AST) -> float | None:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise ValueError(f"metric math: unknown id {node.id!r} in {expression!r}")
            return values[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Div) and right == 0:
                return None
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            left, right = walk(node.left), walk(node.comparators[0])
            if left is None or right is None:
                return None
            return 1.0 if _COMPARE[type(node.ops[0])](left, right) else 0.0
        if isinstance(node, ast.BoolOp):
            parts = [walk(v) for v in node.values]
            if any(p is None for p in parts):
                return None
            truth = all(parts) if isinstance(node.op, ast.And) else any(parts)
            return 1.0 if truth else 0.0
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id.upper()
            args = [walk(a) for a in node.args]
            if name == "IF" and len(args) == 3:
                condition, then, otherwise = args
                return None if condition is None else (then if condition else otherwise)
            if name == "FILL" and len(args) == 2 and isinstance(node.args[1], ast.Constant):
                return args[1] if args[0] is None else args[0]
            if any(a is None for a in args):
                return None
            if name == "CEIL" and len(args) == 1:
                return float(math.ceil(args[0]))
            if name == "FLOOR" and len(args) == 1:
                return float(math.floor(args[0]))
            if name == "ABS" and len(args) == 1:
                return abs(args[0])
            if name in ("MIN", "MAX") and len(args) == 2:
                return min(args) if name == "MIN" else max(args)
        raise ValueError(f"metric math: {ast.dump(node)} is not modelled in {expression!r}")

    return walk(tree)


@dataclass(frozen=True)
class MetricQuery:
    """What an alarm or a target tracking policy reads: one metric, or a math expression over several (the one whose
    ``ReturnData`` is true). ``stats`` holds the metrics by id; ``expression`` is None for a single metric."""

    stats: Mapping[str, MetricStat]
    expression: str | None = None
    label: str = ""

    @property
    def period_s(self) -> int:
        return max(s.period_s for s in self.stats.values())

    def metrics(self) -> set[MetricId]:
        return {s.metric for s in self.stats.values()}

    def value(self, store: MetricStore, period_end: float, now: float) -> float | None:
        values = {key: store.datapoint(stat, period_end, now) for key, stat in self.stats.items()}
        if self.expression is None:
            return next(iter(values.values()))
        if not FILL_WITHOUT_DATA and all(v is None for v in values.values()):
            return None
        return evaluate_expression(self.expression, values)


# --- Alarms -----------------------------------------------------------------------------------------------------------

_BREACH = {
    "GreaterThanThreshold": operator.gt,
    "GreaterThanOrEqualToThreshold": operator.ge,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}


@dataclass
class Alarm:
    """A CloudWatch metric alarm; ``actions`` are the ids of the scaling policies it invokes."""

    name: str
    query: MetricQuery
    threshold: float
    comparison: str
    evaluation_periods: int
    datapoints_to_alarm: int
    treat_missing: str = "missing"
    actions: tuple[str, ...] = ()
    state: str = INSUFFICIENT
    history: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.comparison not in _BREACH:
            raise ValueError(f"alarm {self.name}: comparison {self.comparison!r} is not modelled")
        if self.treat_missing not in ("missing", "notBreaching", "breaching", "ignore"):
            raise ValueError(f"alarm {self.name}: TreatMissingData {self.treat_missing!r} is unknown")
        if not 1 <= self.datapoints_to_alarm <= self.evaluation_periods:
            raise ValueError(f"alarm {self.name}: DatapointsToAlarm must lie in 1..EvaluationPeriods")

    @property
    def period_s(self) -> int:
        return self.query.period_s

    def breaches(self, value: float) -> bool:
        return _BREACH[self.comparison](value, self.threshold)

    def datapoints(self, store: MetricStore, now: float) -> list[float | None]:
        """The evaluation range, oldest first: complete periods ending at or before ``now``."""
        period = self.period_s
        last_end = math.floor(now / period) * period
        count = self.evaluation_periods + EVALUATION_RANGE_EXTRA_PERIODS
        return [self.query.value(store, last_end - k * period, now) for k in range(count - 1, -1, -1)]

    def decide(self, points: Sequence[float | None]) -> tuple[str, list[float]]:
        """The new state and the datapoints it was decided on (what a step policy aggregates)."""
        n, m = self.evaluation_periods, self.datapoints_to_alarm
        present = [p for p in points if p is not None]
        if len(present) >= n:
            window = present[-n:]
            return (ALARM if sum(self.breaches(v) for v in window) >= m else OK), window
        if self.treat_missing in ("breaching", "notBreaching"):
            fill = n - len(present)
            breaching = sum(self.breaches(v) for v in present) + (fill if self.treat_missing == "breaching" else 0)
            return (ALARM if breaching >= m else OK), present
        # missing / ignore with too few datapoints (CloudWatch's special case of an old lone breaching point that
        # still alarms is not modelled).
        if any(not self.breaches(v) for v in present):
            return OK, present
        return (INSUFFICIENT if self.treat_missing == "missing" else self.state), present

    def evaluate(self, store: MetricStore, now: float) -> tuple[bool, list[float]]:
        """Update the state; True when the alarm's actions are to run now (in ALARM, at a period boundary)."""
        state, window = self.decide(self.datapoints(store, now))
        changed = state != self.state
        if changed:
            self.history.append((now, state))
        self.state = state
        due = abs(now / self.period_s - round(now / self.period_s)) * self.period_s < 1.0
        if not RERUN_ACTIONS_IN_ALARM and not changed:
            return False, window
        return self.state == ALARM and due and bool(self.actions), window
