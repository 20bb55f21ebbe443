"""The three hazards of scaling to zero on CloudWatch, each a scenario run on the deployed policy and on the same
policy without its fix (the template rewritten to what the stack deployed before), so the outcome shows what the fix
changes.

* ``wake_vs_idle_alarm``: the queue was used an hour ago (it publishes zeros), the keep-alive alarm is in ALARM and
  re-runs ScaleToZero every minute; SQS's datapoints arrive 2 minutes after their minute. A job comes: does the wake
  stand? Unfixed: no hold, so ScaleToZero sets the count back to 0 while the job waits.
* ``inactive_queue_resume``: the queue sat idle for over six hours, so its metrics resume up to 15 minutes after the
  first message (900 s here). Does the fleet go to zero while jobs wait unpublished? Unfixed: the keep-alive read
  missing data as idle (missing data breaching, each queue's terms FILL(m, 0)).
* ``desired_unpublished_cold_start``: Container Insights publishes no DesiredTaskCount while the only task starts (the
  unfavourable reading; the favourable one is run too). A backlog one task holds: how many tasks are asked for before
  the first serves? Unfixed: the scale-out added the shortfall to the count it read (0), asking for a second task.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from async_inference import config as _env
from bench.scaling.figures import SQS_RESUME_DELAY_DOCUMENTED_S
from bench.scaling.simulation import Delays
from bench.scaling.trace import Request

HAZARDS = ("wake_vs_idle_alarm", "inactive_queue_resume", "desired_unpublished_cold_start")


def unfixed(template: dict[str, Any]) -> dict[str, Any]:
    """The template with the three fixes undone: the keep-alive reads an unpublished metric as idle (FILL(m, 0),
    missing data breaching), the scale-out adds the shortfall (ChangeInCapacity) to the count it reads, and the
    wake holds nothing."""
    result = copy.deepcopy(template)
    resources = result["Resources"]
    for logical_id, resource in resources.items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::CloudWatch::Alarm" and "Metrics" in props:
            for metric in props["Metrics"]:
                expression = metric.get("Expression")
                if expression is None:
                    continue
                if "Idle" in logical_id:
                    ids = re.findall(r"\b(?:visible|inFlight|sent)\d*\b", expression)
                    if len(ids) > 3:  # several queues: each term was filled with 0
                        expression = re.sub(r"\b((?:visible|inFlight|sent)\d*)\b", r"FILL(\1, 0)", expression)
                    metric["Expression"] = expression
                    props["TreatMissingData"] = "breaching"
                match = re.fullmatch(r"IF\((.+) - FILL\(desired, 0\) >= 1, \1, 0\)", expression or "")
                if "TasksShort" in logical_id and match:
                    metric["Expression"] = f"{match.group(1)} - FILL(desired, 0)"
        if resource["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy" and "ScaleOut" in logical_id:
            props["StepScalingPolicyConfiguration"]["AdjustmentType"] = "ChangeInCapacity"
        if resource["Type"] == "AWS::Lambda::Function":
            variables = props.get("Environment", {}).get("Variables", {})
            if _env.ENV_WAKE_HOLD_S in variables:
                variables[_env.ENV_WAKE_HOLD_S] = "0"
    return result


def setting(name: str, requests: list[Request]) -> tuple[list[Request], list[Delays]]:
    """The trace and the delay readings a hazard runs on (the first ``requests``, shifted where the hazard needs
    idle minutes before the first job)."""
    if name == "wake_vs_idle_alarm":
        shifted = [dataclasses.replace(r, arrival_s=r.arrival_s + 600) for r in requests[:2000]]
        return shifted, [Delays(sqs_publication_s=120.0, queue_idle_before_s=3600.0)]
    if name == "inactive_queue_resume":
        return requests[:6000], [Delays(sqs_resume_s=SQS_RESUME_DELAY_DOCUMENTED_S)]
    if name == "desired_unpublished_cold_start":
        burst = [Request(0.5 * i, 800, 200) for i in range(100)]
        return burst, [Delays(desired_while_starting=False), Delays(desired_while_starting=True)]
    raise KeyError(name)


# The hold's trade-off (not a hazard): a wake keeps the service's maximum at what the warm pool can start for the hold,
# which saves the fresh instance a burst one task clears anyway would get (the conversation trace's opening) and asks
# later for the second task of a burst one task cannot clear. ``burst`` is the second kind: the trace's jobs arriving
# within BURST_S of an idle stack.
BURST_S = 300.0


def burst(requests: list[Request]) -> list[Request]:
    """The trace's jobs (their token counts, in order) submitted evenly over ``BURST_S`` to an idle stack."""
    step = BURST_S / max(1, len(requests))
    return [dataclasses.replace(r, arrival_s=i * step) for i, r in enumerate(requests)]
