"""When to let the last worker task go: a keep-alive learned from the queue's arrivals, priced by its mistakes.

Azure Functions' hybrid histogram policy ("Serverless in the Wild", USENIX ATC 2020) keeps an application loaded
after it ran for the keep-alive window, a high percentile of the idle times between its invocations seen over the
last hours, and falls back to a fixed keep-alive when its histogram is not representative. Here an idle time is a
run of one-minute periods in which no message was sent to the worker's queues, read from CloudWatch's
``NumberOfMessagesSent`` (``minutes``, oldest first).

Releasing the last task and being wrong costs a cold start: the GPU it burns before it serves (``cold_start_gpu_s``)
and the wait of the jobs that arrive meanwhile, priced in GPU-seconds (``wait_price``: GPU-seconds a job-second of
waiting is worth). Staying warm costs one GPU-second a second. ``B``, the break-even, is one cold start's price in
seconds of a warm task; the ski-rental rule says that keeping warm for ``B`` and then releasing is never worse than
twice what knowing the next arrival would have cost, whatever the arrivals do.

The keep-alive, once the histogram holds ``min_idle_periods`` idle periods, is the candidate that would have cost
least over the idle periods seen (each kept warm through if it is no longer than the candidate, else the candidate
plus ``B``): the paper's high percentile (with its margin), each seen idle period no longer than it, and ``B``;
of candidates the seen idle periods price alike, the longest. Since ``B`` is a candidate, the choice never costs more
on the arrivals seen than the ski-rental rule, which costs at most twice the best. So a queue whose pauses are short
keeps its task through them, one whose pauses are far longer than a cold start is worth lets it go soon after its
short ones, and the percentile bounds what is kept beyond ``B``, as in the paper. While fewer idle periods have been seen
(the queue pauses, but how long it pauses is not yet known) the keep-alive is ``B`` itself, the choice that is safe
without a prediction. A queue that has not paused once in the window has no idle time to learn from: its keep-alive
is the fixed ``fallback_s``, the alarm's own minutes, as the paper falls back to a fixed keep-alive.

The pre-warm window (the histogram's low percentile) is computed as the paper does, and reported: acting on it means
releasing right after the last job and waking before the next, which pays a cold start's GPU every time; the
decision here only keeps warm or lets go.

Nothing here calls AWS: ``lambdas/keep_alive`` reads the minutes and publishes the decision, ``bench.scaling``
simulates the same decision over its trace.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

# The metric the decision is published as (namespace settings.METRICS_NAMESPACE, dimension ServiceName): 1 while the
# last task is to be kept, 0 once it may go. The keep-alive alarm (cdk/queue_scaling.py) adds it to the idle sum.
METRIC_KEEP_WARM = "KeepWarm"
METRIC_KEEP_ALIVE_S = "KeepAliveSeconds"
METRIC_BREAK_EVEN_S = "BreakEvenSeconds"
ENV_KEEP_ALIVE_POLICY = "KEEP_ALIVE_POLICY"
ENV_KEEP_ALIVE_QUEUES = "KEEP_ALIVE_QUEUES"
ENV_KEEP_ALIVE_SERVICE = "KEEP_ALIVE_SERVICE"
ENV_KEEP_ALIVE_CLUSTER = "KEEP_ALIVE_CLUSTER"
MINUTE_S = 60.0


@dataclass(frozen=True)
class KeepAlivePolicy:
    """The keep-alive's settings.

    :param cold_start_s: the wait a wake from zero inflicts on the job that wakes it (submit to first token). Default:
        134 s, the deployed stack's first-job start from an idle stack (docs/scaling.md).
    :param cold_start_gpu_s: GPU-seconds a wake costs before its task serves: the pooled instance's start to serving
        plus the pool replacement's initialization. Default: 580 s (134 + 445 s, docs/scaling.md).
    :param wait_price: GPU-seconds one second of a job's wait is worth. Default: 1/135, a job's share of a batch of
        135 (the stack sets 1 / max_num_seqs): a job kept waiting a second is priced as that second of its batch slot.
    :param high_percentile: the idle-time percentile kept warm through at most. Default: 99 (the paper's keep-alive).
    :param low_percentile: the pre-warm percentile (reported only). Default: 5 (the paper's).
    :param margin: the keep-alive's margin over the percentile. Default: 0.1 (the paper's 10 %).
    :param window_minutes: the histogram's range, minutes of arrivals read back. Default: 240 (the paper's 4 hours).
    :param min_idle_periods: idle periods the histogram needs to be representative. Default: 5.
    :param alarm_s: how long the keep-alive alarm itself waits after the decision lets the task go (its evaluation
        minutes), which the decision subtracts so that the task goes at the keep-alive, not that much later; the
        alarm's minutes stay the keep-alive when no decision is published. Default: 180 s (3 minutes).
    :param fallback_s: the fixed keep-alive when the histogram is not representative. Default: 180 s, the alarm's
        minutes (the stack sets both from ``keep_alive_minutes``).
    """

    cold_start_s: float = 134.0
    cold_start_gpu_s: float = 580.0
    wait_price: float = 1 / 135
    high_percentile: float = 99.0
    low_percentile: float = 5.0
    margin: float = 0.1
    window_minutes: int = 240
    min_idle_periods: int = 5
    alarm_s: float = 180.0
    fallback_s: float = 180.0

    def __post_init__(self) -> None:
        if self.cold_start_s < 0 or self.cold_start_gpu_s < 0 or self.wait_price < 0:
            raise ValueError(
                f"cold_start_s ({self.cold_start_s:g}), cold_start_gpu_s ({self.cold_start_gpu_s:g}) and wait_price "
                f"({self.wait_price:g}) must not be negative"
            )
        if not 0 <= self.low_percentile <= self.high_percentile <= 100:
            raise ValueError(
                f"percentiles must satisfy 0 <= low_percentile ({self.low_percentile:g}) <= high_percentile "
                f"({self.high_percentile:g}) <= 100"
            )
        if self.alarm_s < 0 or self.fallback_s < 0:
            raise ValueError(f"alarm_s ({self.alarm_s:g}) and fallback_s ({self.fallback_s:g}) must not be negative")
        if self.window_minutes < 2 or self.min_idle_periods < 1 or self.margin < 0:
            raise ValueError(
                f"window_minutes ({self.window_minutes}) must be at least 2, min_idle_periods "
                f"({self.min_idle_periods}) at least 1 and margin ({self.margin:g}) not negative"
            )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KeepAlivePolicy:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Decision:
    """What the histogram says now. ``keep_warm``: keep the last task (the time since the last arrival is below the
    keep-alive). ``source``: ``histogram`` (learned), ``ski_rental`` (too few idle periods yet: B) or ``fallback``
    (no idle period in the window: the fixed keep-alive)."""

    keep_warm: bool
    keep_alive_s: float
    prewarm_s: float
    break_even_s: float
    idle_s: float
    idle_periods: int
    source: str


def idle_periods(minutes: Sequence[float | None]) -> list[int]:
    """The idle times the minutes hold, in whole minutes: each run of minutes without a message between two minutes
    with one (0 for two busy minutes in a row). A minute CloudWatch has nothing for (None) counts as without."""
    busy = [i for i, sent in enumerate(minutes) if sent]
    return [later - earlier - 1 for earlier, later in zip(busy, busy[1:], strict=False)]


def jobs_a_cold_start_meets(minutes: Sequence[float | None], cold_start_s: float) -> float:
    """The jobs that arrived, on average, within a cold start of the end of an idle period (the jobs a release before
    it would have kept waiting); with no idle period seen, the jobs of an average busy minute's cold start."""
    span = max(1, math.ceil(cold_start_s / MINUTE_S))
    counts = [float(sent or 0) for sent in minutes]
    wakes = [i for i in range(1, len(counts)) if counts[i] and not counts[i - 1]]
    if wakes:
        return sum(sum(counts[i : i + span]) for i in wakes) / len(wakes)
    busy = [c for c in counts if c]
    return span * sum(busy) / len(busy) if busy else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by linear interpolation (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def break_even_s(policy: KeepAlivePolicy, minutes: Sequence[float | None]) -> float:
    """``B``, one cold start's price in GPU-seconds (= seconds of one warm task): its GPU before serving, plus the
    jobs it meets kept waiting half a cold start on average, at ``wait_price``."""
    met = jobs_a_cold_start_meets(minutes, policy.cold_start_s)
    return policy.cold_start_gpu_s + policy.wait_price * met * policy.cold_start_s / 2


def cheapest_keep_alive(policy: KeepAlivePolicy, idle: Sequence[int], bound: float) -> float:
    """Of the paper's high percentile of ``idle`` (minutes) with its margin, each idle period no longer than it (with
    the margin) and ``bound`` (B), the keep-alive that would have cost least over ``idle``: an idle period no longer
    than the keep-alive costs its length, a longer one the keep-alive plus ``bound``. Of keep-alives the idle periods
    seen price alike, the longest: an idle period between two of them, not yet seen, costs the longer one its length
    and the shorter one a cold start more."""
    # An idle period of g empty minutes lasted up to g + 1 minutes.
    lasted = [(g + 1) * MINUTE_S for g in idle]
    high = (percentile(idle, policy.high_percentile) + 1) * MINUTE_S * (1 + policy.margin)
    candidates = {high, bound, *(t * (1 + policy.margin) for t in lasted if t * (1 + policy.margin) <= high)}

    def cost(keep_alive: float) -> float:
        return sum(t if t <= keep_alive else keep_alive + bound for t in lasted)

    return min(sorted(candidates, reverse=True), key=cost)


def decide(policy: KeepAlivePolicy, minutes: Sequence[float | None]) -> Decision:
    """The keep-alive over ``minutes`` (messages sent per minute, oldest first, the newest published minute last;
    only the last ``policy.window_minutes`` are read) and whether the last task is to be kept now."""
    window = list(minutes)[-policy.window_minutes :]
    while window and window[-1] is None:  # minutes CloudWatch has not published yet
        window.pop()
    bound = break_even_s(policy, window)
    idle = [g for g in idle_periods(window) if g > 0]
    busy = [i for i, sent in enumerate(window) if sent]
    # The minutes since the last minute with a message: the whole window when none had one.
    idle_s = (len(window) - 1 - busy[-1]) * MINUTE_S if busy else len(window) * MINUTE_S
    if len(idle) >= policy.min_idle_periods:
        keep_alive = cheapest_keep_alive(policy, idle, bound)
        prewarm, source = (percentile(idle, policy.low_percentile) + 1) * MINUTE_S, "histogram"
    elif idle:
        keep_alive, prewarm, source = bound, 0.0, "ski_rental"
    else:
        keep_alive, prewarm, source = min(policy.fallback_s, bound), 0.0, "fallback"
    return Decision(
        keep_warm=bool(busy) and idle_s < keep_alive - policy.alarm_s,
        keep_alive_s=round(keep_alive, 1),
        prewarm_s=round(prewarm, 1),
        break_even_s=round(bound, 1),
        idle_s=idle_s,
        idle_periods=len(idle),
        source=source,
    )
