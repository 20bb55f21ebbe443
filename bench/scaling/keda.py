"""KEDA's aws-sqs-queue scaler and the Horizontal Pod Autoscaler it feeds, read from deploy/eks/'s ScaledObject.

Semantics (KEDA docs, "Scaling Deployments" and the aws-sqs-queue scaler; Kubernetes "Horizontal Pod Autoscaling"):

* Every ``pollingInterval`` KEDA asks SQS (GetQueueAttributes, no CloudWatch) for ApproximateNumberOfMessages, plus
  ApproximateNumberOfMessagesNotVisible when ``scaleOnInFlight`` (and ...Delayed when ``scaleOnDelayed``).
* Activation: above ``activationQueueLength`` the trigger is active; KEDA itself takes the workload from 0 to 1 and
  notes the time. When the trigger has not been active for ``cooldownPeriod``, KEDA scales to ``minReplicaCount``.
* An ``aws-cloudwatch`` trigger on the learned keep-alive's ``KeepWarm`` metric (``async_inference.keep_alive``)
  is active while the decision keeps the last task: the cooldown then counts from the decision's last keep, not the
  last message (``KedaSpec.keep_warm_trigger``). Other aws-cloudwatch triggers are refused, named.
* Between 1 and ``maxReplicaCount`` the HPA scales on the metric as an AverageValue target of ``queueLength``:
  desired = ceil(messages / queueLength), skipped within 10 % tolerance, scale-up at most max(4 pods, 100 %) per
  sync, scale-down to the highest recommendation of the stabilization window (300 s).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import yaml

from async_inference import settings
from async_inference.keep_alive import METRIC_KEEP_WARM
from bench.scaling.figures import (
    HPA_SCALE_DOWN_STABILIZATION_S,
    HPA_SCALE_UP_PERCENT,
    HPA_SCALE_UP_PODS,
    HPA_TOLERANCE,
)

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "eks"


@dataclass(frozen=True)
class KedaSpec:
    polling_interval_s: float
    cooldown_period_s: float
    min_replicas: int
    max_replicas: int
    queue_length: float
    activation_queue_length: float
    scale_on_in_flight: bool
    scale_on_delayed: bool
    scale_down_stabilization_s: float = HPA_SCALE_DOWN_STABILIZATION_S
    # An aws-cloudwatch trigger on the learned keep-alive's KeepWarm: active while the decision keeps the last task.
    keep_warm_trigger: bool = False


def read_scaled_object(path: Path = MANIFESTS / "scaledobject.yaml") -> KedaSpec:
    """The ScaledObject's aws-sqs-queue trigger and replica bounds; KEDA's defaults where the manifest says nothing."""
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    scaled = next((d for d in documents if d.get("kind") == "ScaledObject"), None)
    if scaled is None:
        raise ValueError(f"{path}: no ScaledObject")
    spec = scaled["spec"]
    triggers = [t for t in spec.get("triggers", []) if t.get("type") == "aws-sqs-queue"]
    if len(triggers) != 1:
        raise ValueError(f"{path}: expected one aws-sqs-queue trigger, found {len(triggers)}")
    meta = triggers[0].get("metadata", {})
    keep_warm = False
    for trigger in spec.get("triggers", []):
        if trigger.get("type") != "aws-cloudwatch":
            continue
        watched = trigger.get("metadata", {})
        if (watched.get("namespace"), watched.get("metricName")) != (settings.METRICS_NAMESPACE, METRIC_KEEP_WARM):
            raise ValueError(
                f"{path}: an aws-cloudwatch trigger on {watched.get('namespace')}/{watched.get('metricName')} is not "
                f"modelled (only {settings.METRICS_NAMESPACE}/{METRIC_KEEP_WARM}, the learned keep-alive)"
            )
        keep_warm = True
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
    window = behavior.get("scaleDown", {}).get("stabilizationWindowSeconds", HPA_SCALE_DOWN_STABILIZATION_S)

    def flag(name: str, default: bool) -> bool:
        return str(meta.get(name, str(default))).lower() == "true"

    return KedaSpec(
        polling_interval_s=float(spec.get("pollingInterval", 30)),
        cooldown_period_s=float(spec.get("cooldownPeriod", 300)),
        min_replicas=int(spec.get("minReplicaCount", 0)),
        max_replicas=int(spec.get("maxReplicaCount", 100)),
        queue_length=float(meta.get("queueLength", 5)),
        activation_queue_length=float(meta.get("activationQueueLength", 0)),
        scale_on_in_flight=flag("scaleOnInFlight", True),
        scale_on_delayed=flag("scaleOnDelayed", False),
        scale_down_stabilization_s=float(window),
        keep_warm_trigger=keep_warm,
    )


class KedaController:
    """One ScaledObject: ``tick(now, visible, in_flight, replicas)`` returns the replica count it sets, or None."""

    def __init__(self, spec: KedaSpec) -> None:
        self.spec = spec
        self.last_active_s = -math.inf
        self._recommendations: deque[tuple[float, int]] = deque()
        self.polls = 0

    def messages(self, visible: int, in_flight: int) -> int:
        return visible + (in_flight if self.spec.scale_on_in_flight else 0)

    def tick(self, now: float, visible: int, in_flight: int, replicas: int, keep_warm: bool = False) -> int | None:
        """``keep_warm``: the learned keep-alive's last published decision (read only with ``keep_warm_trigger``)."""
        spec = self.spec
        self.polls += 1
        metric = self.messages(visible, in_flight)
        active = metric > spec.activation_queue_length
        if spec.keep_warm_trigger and keep_warm and replicas > 0:
            self.last_active_s = now  # the trigger is active; its replica count (1) is what the HPA keeps at least
        if active:
            self.last_active_s = now
        if replicas == 0:
            return max(1, spec.min_replicas) if active else None
        if not active and now - self.last_active_s >= spec.cooldown_period_s and spec.min_replicas == 0:
            self._recommendations.clear()
            return 0
        # The HPA, between max(1, minReplicaCount) and maxReplicaCount.
        low = max(1, spec.min_replicas)
        ratio = (metric / replicas) / spec.queue_length
        desired = replicas if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(metric / spec.queue_length)
        desired = max(low, min(spec.max_replicas, desired))
        self._recommendations.append((now, desired))
        while self._recommendations and now - self._recommendations[0][0] > spec.scale_down_stabilization_s:
            self._recommendations.popleft()
        if desired < replicas:
            desired = min(replicas, max(r for _, r in self._recommendations))
        elif desired > replicas:
            desired = min(desired, max(replicas + HPA_SCALE_UP_PODS, replicas * (1 + HPA_SCALE_UP_PERCENT / 100)))
        return desired if desired != replicas else None
