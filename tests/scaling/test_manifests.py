"""deploy/eks/ against the Kubernetes and KEDA schemas, and against the ECS stack they mirror."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from async_inference.config import ServiceConfig
from bench.scaling.keda import read_scaled_object
from bench.scaling.trace import SHARED_DATA
from bench.scaling.worker import DRAIN_TIMEOUT_S
from tests.scaling.conftest import cdk_json_context

ROOT = Path(__file__).resolve().parents[2]
EKS = ROOT / "deploy" / "eks"
KEDA_CRDS = SHARED_DATA / "keda"
KUBERNETES_VERSION = "1.31.0"


def documents() -> list[dict]:
    return [d for path in sorted(EKS.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(kind: str) -> dict:
    return next(d for d in documents() if d["kind"] == kind)


def crd_schema(name: str) -> dict:
    crd = yaml.safe_load((KEDA_CRDS / f"keda.sh_{name}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("kind", ["Namespace", "Deployment", "ServiceAccount"])
def test_kubernetes_resources_validate_against_the_published_schema(kind):
    # GIVEN a core resource WHEN validated strictly against Kubernetes' OpenAPI schema THEN it passes
    kubernetes_validate.validate(by_kind(kind), KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize(
    "kind, crd", [("ScaledObject", "scaledobjects"), ("TriggerAuthentication", "triggerauthentications")]
)
def test_keda_resources_validate_against_keda_crds(kind, crd):
    # GIVEN a KEDA resource WHEN validated against its CRD's schema THEN it passes
    jsonschema.validate(by_kind(kind), crd_schema(crd))


def test_an_invalid_scaled_object_is_refused():
    # GIVEN a ScaledObject with a string replica count WHEN validated THEN the schema refuses it (the check can fail)
    broken = {**by_kind("ScaledObject"), "spec": {**by_kind("ScaledObject")["spec"], "maxReplicaCount": "two"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crd_schema("scaledobjects"))


def test_grace_period_covers_the_worker_drain_and_matches_the_ecs_stop_timeout():
    # GIVEN the Deployment WHEN read THEN SIGKILL comes 120 s after SIGTERM, as on ECS, after the 90 s drain
    from cdk.gpu_worker_service import STOP_TIMEOUT

    grace = by_kind("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == STOP_TIMEOUT.to_seconds() and grace > DRAIN_TIMEOUT_S


def test_worker_environment_uses_the_names_the_code_reads():
    # GIVEN the container's environment WHEN compared with ServiceConfig THEN every name it reads is set
    container = by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    names = {e["name"] for e in container["env"]}
    required = set(ServiceConfig("t", "b", "q", "a", dlq_url="d").to_env())
    assert required <= names
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_scaled_object_mirrors_the_ecs_limits_and_reads_as_the_keda_policy():
    # GIVEN the ScaledObject WHEN the simulator reads it THEN zero to max_worker_tasks, activation on one message,
    # in-flight counted, 15 s polling, the fixed keep-alive (3 minutes) as cooldown, the tuned target: what one pod
    # handles, its MAX_NUM_SEQS, and the learned keep-alive's trigger
    spec = read_scaled_object(EKS / "scaledobject.yaml")
    assert (spec.min_replicas, spec.max_replicas) == (0, cdk_json_context()["max_worker_tasks"])
    assert (spec.activation_queue_length, spec.scale_on_in_flight, spec.scale_on_delayed) == (0, True, False)
    env = {e["name"]: e.get("value") for e in by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (spec.polling_interval_s, spec.cooldown_period_s, spec.queue_length) == (15, 180, int(env["MAX_NUM_SEQS"]))
    assert spec.keep_warm_trigger
    trigger = by_kind("ScaledObject")["spec"]["triggers"][0]
    assert trigger["authenticationRef"]["name"] == by_kind("TriggerAuthentication")["metadata"]["name"]
    assert by_kind("ScaledObject")["spec"]["scaleTargetRef"]["name"] == by_kind("Deployment")["metadata"]["name"]


def test_the_keep_warm_trigger_reads_the_metric_the_stack_publishes(stack_template):
    # GIVEN the ScaledObject's aws-cloudwatch trigger and the synthesized stack WHEN compared THEN it reads the metric,
    # statistic and dimension the ECS Idle alarm reads (the learned keep-alive's decision for the worker service)
    from async_inference.keep_alive import ENV_KEEP_ALIVE_SERVICE

    [watched] = [t["metadata"] for t in by_kind("ScaledObject")["spec"]["triggers"] if t["type"] == "aws-cloudwatch"]
    resources = stack_template["Resources"]
    [idle] = [r for k, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm" and "ScalingIdle" in k]
    [keep_warm] = [m["MetricStat"] for m in idle["Properties"]["Metrics"] if m["Id"] == "keepWarm"]
    [dimension] = keep_warm["Metric"]["Dimensions"]
    assert (watched["namespace"], watched["metricName"], watched["metricStat"]) == (
        keep_warm["Metric"]["Namespace"],
        keep_warm["Metric"]["MetricName"],
        keep_warm["Stat"],
    )
    [function] = [
        r for r in resources.values() if ENV_KEEP_ALIVE_SERVICE in str(r["Properties"].get("Environment", ""))
    ]
    service = function["Properties"]["Environment"]["Variables"][ENV_KEEP_ALIVE_SERVICE]
    assert (watched["dimensionName"], watched["dimensionValue"]) == (dimension["Name"], service)


def test_worker_model_and_batch_match_the_stack():
    # GIVEN the Deployment and cdk.json WHEN compared THEN the pod runs the model and batch the ECS task runs (the
    # batch cdk.capacity sizes when cdk.json sets none)
    from cdk.options import AsyncInferenceServiceProps

    env = {e["name"]: e.get("value") for e in by_kind("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    context = cdk_json_context()
    props = AsyncInferenceServiceProps(
        model=context["model"], gpu_instance_type=context["gpu_instance_type"], max_num_seqs=context.get("max_num_seqs")
    )
    assert (env["MODEL"], int(env["MAX_NUM_SEQS"])) == (context["model"], props.effective_max_num_seqs())
