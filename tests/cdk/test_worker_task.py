"""The worker's task definition: what the container is told (region, metrics, engine), how ECS checks it, its image."""

from __future__ import annotations

import pytest

from async_inference import settings
from cdk.gpu_worker_service import WORKER_SERVICE_NAME

pytestmark = pytest.mark.cdk


@pytest.mark.parametrize("name", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_environment_agnostic_stack_gives_the_worker_the_deploy_region(synthesized, name):
    """GIVEN a stack synthesized without a region WHEN reading the worker's environment THEN the region is the
    deploy-time AWS::Region, not left to the ECS agent."""
    assert synthesized.worker_environment()[name] == {"Ref": "AWS::Region"}


@pytest.mark.parametrize("name", ["AWS_REGION", "AWS_DEFAULT_REGION"])
def test_stack_with_a_region_gives_the_worker_that_region(synth_variant, name):
    """GIVEN a stack synthesized for eu-west-1 WHEN reading the worker's environment THEN the region is eu-west-1."""
    assert synth_variant(region="eu-west-1").worker_environment()[name] == "eu-west-1"


def test_worker_metrics_go_to_the_shared_namespace_under_the_worker_service_name(synthesized):
    """GIVEN the worker's Powertools Metrics WHEN reading its environment THEN the namespace and the `service`
    dimension are the ones the dashboard plots."""
    environment = synthesized.worker_environment()
    assert environment["POWERTOOLS_METRICS_NAMESPACE"] == settings.METRICS_NAMESPACE
    assert environment["POWERTOOLS_SERVICE_NAME"] == WORKER_SERVICE_NAME == "async-inference-worker"


def test_worker_engine_is_vllm(synthesized):
    """GIVEN the worker refuses to start without ENGINE WHEN reading its environment THEN ENGINE is vllm."""
    assert synthesized.worker_environment()["ENGINE"] == "vllm"


def test_a_stack_with_account_and_region_passes_cdk_nag(synth_variant):
    """GIVEN the environment `cdk deploy` sets from the credentials (account and region) WHEN synthesizing with
    cdk-nag THEN every acknowledgement still matches its finding (ids then carry the literal account and region)."""
    variant = synth_variant(region="eu-west-1")  # raises on an unacknowledged finding
    assert (variant.stack.account, variant.stack.region) == ("111122223333", "eu-west-1")


def test_container_health_check_runs_the_worker_health_command(synthesized):
    """GIVEN the health contract (the worker touches its health file while its loops run) WHEN reading the container
    THEN ECS runs `python3 -m gpu_worker.health` as its health check."""
    check = synthesized.container()["HealthCheck"]
    assert check["Command"] == ["CMD", "python3", "-m", "gpu_worker.health"]


def test_health_check_leaves_a_model_load_fifteen_minutes(synthesized):
    """GIVEN a worker whose loops start only after its model loads WHEN ECS checks it THEN the start period is ECS's
    300 s maximum and a task is unhealthy only after 15 minutes without one passing check."""
    check = synthesized.container()["HealthCheck"]
    assert check["StartPeriod"] == 300
    assert check["StartPeriod"] + check["Retries"] * check["Interval"] == 15 * 60
    assert 2 <= check["Timeout"] < check["Interval"]


def test_worker_image_is_built_for_amd64_for_an_x86_gpu_type(synthesized):
    """GIVEN g5.xlarge (x86_64) WHEN reading the image asset THEN it is built for linux/amd64, whatever machine runs
    the build (an arm64 laptop would otherwise build an image a g5 cannot start)."""
    [image] = synthesized.docker_images()
    assert image["source"]["platform"] == "linux/amd64"


def test_graviton_gpu_type_gets_an_arm64_image_on_the_given_ami(synth_variant):
    """GIVEN g5g.xlarge (Graviton) and an AMI parameter WHEN synthesized THEN the image is built for linux/arm64 and
    the instances launch from the AMI the parameter holds."""
    # cdk.capacity has no GPU for g5g, so the batch is given.
    variant = synth_variant(
        gpu_instance_type="g5g.xlarge", gpu_ami_parameter_name="/platform/arm64-gpu-ecs-ami", max_num_seqs=16
    )
    [image] = variant.docker_images()
    assert image["source"]["platform"] == "linux/arm64"
    [template] = variant.resources("AWS::EC2::LaunchTemplate").values()
    data = template["Properties"]["LaunchTemplateData"]
    assert data["InstanceType"] == "g5g.xlarge"
    parameter = data["ImageId"]["Ref"]
    assert variant.json["Parameters"][parameter]["Default"] == "/platform/arm64-gpu-ecs-ami"


def test_the_default_model_gets_the_hermes_tool_parser(synthesized):
    """GIVEN the default model (Qwen2.5, which writes Hermes-style tool calls) WHEN reading the worker's environment
    THEN vLLM is told to parse tool calls with hermes, so tool_choice auto works."""
    assert synthesized.worker_environment()["TOOL_CALL_PARSER"] == "hermes"


def test_a_model_without_a_known_parser_gets_none_unless_one_is_given(synth_variant):
    """GIVEN a model no parser is known for WHEN synthesized with and without tool_call_parser THEN the worker gets
    that parser, or no TOOL_CALL_PARSER at all (tool_choice auto is then refused by vLLM, forced calls still work)."""
    assert "TOOL_CALL_PARSER" not in synth_variant(model="org/unknown-7b", max_num_seqs=8).worker_environment()
    given = synth_variant(model="org/unknown-7b", max_num_seqs=8, tool_call_parser="llama3_json")
    assert given.worker_environment()["TOOL_CALL_PARSER"] == "llama3_json"
