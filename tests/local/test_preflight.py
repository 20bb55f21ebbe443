"""``async-inference preflight`` (issue 21): each prerequisite of a first deploy, checked against moto server where
moto answers (zones and vCPUs of instance types, the CDK bootstrap stack and parameter). Where moto has no answer
(Service Quotas knows only VPC quotas; Lambda's GetAccountSettings is not served), botocore's Stubber answers, after
checking each answer against the API's model; the Docker checks run a stand-in ``docker`` on PATH."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from async_inference import cli, preflight
from async_inference.preflight import Plan
from local_runtime.moto_server import LOCAL_CREDENTIALS, MotoServer

REGION = "us-east-1"


@pytest.fixture
def client(moto: MotoServer):
    def make(service: str):
        return boto3.client(
            service,
            endpoint_url=moto.url,
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    return make


def _stubbed(service: str, operation: str, response: dict, expected: dict | None = None):
    stubbed = boto3.client(service, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    stubber = Stubber(stubbed)
    stubber.add_response(operation, response, expected)
    stubber.activate()
    return stubbed


def _quota(value: float):
    return _stubbed(
        "service-quotas",
        "get_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": value}},
        {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"},
    )


def test_a_gpu_quota_below_the_instances_vcpus_is_missing_with_the_request_that_fixes_it(client):
    # GIVEN 2 x g5.xlarge (4 vCPUs each, as EC2 describes the type) and a new account's quota of 0
    finding = preflight.check_gpu_quota(client("ec2"), _quota(0), Plan(instances=2))
    # THEN it is missing, and the fix asks for 8 vCPUs of the G and VT quota
    assert not finding.ok and "need 8" in finding.detail
    assert "--quota-code L-DB2E81BA --desired-value 8" in finding.fix
    # AND a quota of 8 is enough
    assert preflight.check_gpu_quota(client("ec2"), _quota(8), Plan(instances=2)).ok


def test_a_new_accounts_lambda_concurrency_is_missing_with_the_quota_to_raise(client):
    def settings(limit: int):
        return _stubbed(
            "lambda",
            "get_account_settings",
            {"AccountLimit": {"ConcurrentExecutions": limit, "UnreservedConcurrentExecutions": limit}},
        )

    finding = preflight.check_lambda_concurrency(settings(10), Plan())
    assert not finding.ok and "L-B99A9384" in finding.fix
    assert preflight.check_lambda_concurrency(settings(1000), Plan()).ok


def test_zones_that_do_not_offer_the_gpu_type_are_named_with_zones_that_do(client):
    ec2 = client("ec2")
    # GIVEN a zone moto says does not offer g5.xlarge (us-east-1e) among the chosen ones
    finding = preflight.check_zones(ec2, Plan(zones=("us-east-1a", "us-east-1e")))
    # THEN it is missing, naming the zone, and the fix is the context option with zones that offer it
    assert not finding.ok and "us-east-1e" in finding.detail
    assert "availability_zones" in finding.fix
    suggested = json.loads(finding.fix.split("availability_zones='")[1].split("'")[0])
    offered = {
        o["Location"]
        for o in ec2.describe_instance_type_offerings(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": ["g5.xlarge"]}]
        )["InstanceTypeOfferings"]
    }
    assert suggested and set(suggested) <= offered
    # AND without zones, the region's first two are checked (what the stack takes)
    assert preflight.check_zones(ec2, Plan()).ok


def test_bootstrap_is_missing_until_the_toolkit_stack_and_its_version_exist(client):
    cloudformation, ssm = client("cloudformation"), client("ssm")
    # GIVEN a fresh account THEN bootstrap is missing, fixed by cdk bootstrap
    finding = preflight.check_bootstrap(cloudformation, ssm, Plan())
    assert not finding.ok and "cdk bootstrap" in finding.fix
    # WHEN the toolkit stack exists at an old version THEN still missing
    cloudformation.create_stack(
        StackName="CDKToolkit", TemplateBody=json.dumps({"Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}}})
    )
    ssm.put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="5", Type="String")
    assert not preflight.check_bootstrap(cloudformation, ssm, Plan()).ok
    # WHEN it is bootstrapped at a current version THEN ok
    ssm.put_parameter(Name="/cdk-bootstrap/hnb659fds/version", Value="21", Type="String", Overwrite=True)
    assert preflight.check_bootstrap(cloudformation, ssm, Plan()).ok


def _docker(folder: Path, monkeypatch: pytest.MonkeyPatch, platforms: str, engine_rc: int = 0) -> None:
    """A stand-in docker first on PATH: a server version, and a buildx builder offering ``platforms``."""
    script = folder / "bin" / "docker"
    script.parent.mkdir(parents=True)
    script.write_text(f"""#!/bin/sh
case "$1" in
  version) [ {engine_rc} -eq 0 ] && echo 27.3.1 || echo 'Cannot connect to the Docker daemon' >&2; exit {engine_rc};;
  buildx) printf 'Name: default\\nPlatforms: {platforms}\\n';;
esac
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")


def test_docker_and_the_image_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # GIVEN an arm64 laptop whose builder emulates amd64 THEN both pass (the build is emulated)
    _docker(tmp_path, monkeypatch, "linux/arm64, linux/amd64*")
    found = {f.check: f for f in preflight.check_docker(Plan(), machine="arm64")}
    assert found["docker"].ok and found["image_platform"].ok and "emulation" in found["image_platform"].detail
    # GIVEN a builder without amd64 THEN the image platform is missing, with QEMU or a CI runner as the fix
    _docker(tmp_path / "native-only", monkeypatch, "linux/arm64")
    [_, platform] = preflight.check_docker(Plan(), machine="arm64")
    assert not platform.ok and "binfmt" in platform.fix


def test_a_docker_engine_that_does_not_answer_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _docker(tmp_path, monkeypatch, "linux/amd64", engine_rc=1)
    [finding] = preflight.check_docker(Plan(), machine="x86_64")
    assert not finding.ok and "start the Docker daemon" in finding.fix


def test_the_cli_prints_each_missing_prerequisite_with_its_fix(moto: MotoServer, monkeypatch, capsys):
    # GIVEN a fresh account (moto) and the CLI pointed at it
    for name, value in {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": moto.url}.items():
        monkeypatch.setenv(name, value)
    # WHEN the platform team runs the preflight
    code = cli.main(["preflight", "--no-docker", "--zones", "us-east-1a,us-east-1e"])
    out = capsys.readouterr().out
    # THEN it fails, and each missing prerequisite is printed with its fix: the zone, the bootstrap and ECS's
    # service-linked role (moto answers them), and the two quotas moto cannot report (said, not guessed)
    assert code == 1
    for check in ("gpu_quota", "ecs_service_linked_role", "lambda_concurrency", "zones", "bootstrap"):
        line = next(line for line in out.splitlines() if f" {check}:" in line)
        assert line.startswith("MISSING"), line
    assert out.count("fix: ") == 5
    assert "missing: gpu_quota, ecs_service_linked_role, lambda_concurrency, zones, bootstrap" in out


# --- issue 27: every fleet and warm pool in the quota, ECS's service-linked role -------------------------------------


def _template(*fleets: tuple[str, int, int]) -> dict:
    """A synthesized template's GPU groups as aws-cdk-lib writes them: (instance type, MaxSize, warm pool size)."""
    resources: dict = {}
    for index, (instance_type, max_size, pool) in enumerate(fleets):
        resources[f"Launch{index}"] = {
            "Type": "AWS::EC2::LaunchTemplate",
            "Properties": {"LaunchTemplateData": {"InstanceType": instance_type}},
        }
        resources[f"Group{index}"] = {
            "Type": "AWS::AutoScaling::AutoScalingGroup",
            "Properties": {
                "MaxSize": str(max_size),
                "MinSize": "0",
                "LaunchTemplate": {"LaunchTemplateId": {"Ref": f"Launch{index}"}},
            },
        }
        if pool:
            resources[f"Pool{index}"] = {
                "Type": "AWS::AutoScaling::WarmPool",
                "Properties": {
                    "AutoScalingGroupName": {"Ref": f"Group{index}"},
                    "MinSize": pool,
                    "MaxGroupPreparedCapacity": pool,
                },
            }
    return {"Resources": resources}


def test_every_fleet_and_its_warm_pool_count_in_the_gpu_quota(client):
    # GIVEN two fleets: 2 x g5.xlarge with a pool of 1, 1 x g6.xlarge with a pool of 1 (4 vCPUs each type)
    demand = preflight.demand_from_template(_template(("g5.xlarge", 2, 1), ("g6.xlarge", 1, 1)))
    assert demand == [preflight.GpuDemand("g5.xlarge", 3), preflight.GpuDemand("g6.xlarge", 2)]
    # WHEN the quota allows the first fleet's 2 instances only (8 vCPUs: what the preflight counted before)
    finding = preflight.check_gpu_quota(client("ec2"), _quota(8), Plan(demand=demand))
    # THEN it is missing: (3 + 2) x 4 = 20 vCPUs, and the fix asks for 20
    assert not finding.ok and "need 20" in finding.detail
    assert "--desired-value 20" in finding.fix
    assert preflight.check_gpu_quota(client("ec2"), _quota(20), Plan(demand=demand)).ok


def test_ecs_service_linked_role_is_missing_until_it_exists(client):
    iam = client("iam")
    # GIVEN an account that never used ECS THEN the role is missing, with the command that creates it
    finding = preflight.check_service_linked_role(iam)
    assert not finding.ok and finding.fix == "aws iam create-service-linked-role --aws-service-name ecs.amazonaws.com"
    # WHEN it exists, as IAM names it (moto's CreateServiceLinkedRole spells it AWSServiceRoleForecs) THEN ok
    trust = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ecs.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    iam.create_role(
        RoleName="AWSServiceRoleForECS",
        Path="/aws-service-role/ecs.amazonaws.com/",
        AssumeRolePolicyDocument=json.dumps(trust),
    )
    assert preflight.check_service_linked_role(iam).ok


def test_the_cli_reads_the_fleets_from_the_synthesized_template(moto: MotoServer, monkeypatch, capsys, tmp_path):
    # GIVEN a template with two fleets and the CLI pointed at it (what `make deploy` runs before cdk deploy)
    for name, value in {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": moto.url}.items():
        monkeypatch.setenv(name, value)
    template = tmp_path / "AsyncInference.template.json"
    template.write_text(json.dumps(_template(("g5.xlarge", 2, 1), ("g6.xlarge", 1, 0))))
    # WHEN it runs THEN the quota line names both fleets, and it fails (exit 1) so that cdk deploy does not run
    code = cli.main(["preflight", "--no-docker", "--template", str(template)])
    out = capsys.readouterr().out
    assert code == 1
    assert "3 x g5.xlarge" in out and "1 x g6.xlarge" in out


# --- issue 27: API Gateway's account logging role is not overwritten --------------------------------------------------


def test_an_accounts_api_gateway_logging_role_is_never_replaced_and_a_missing_one_is_asked_for(client):
    apigateway = client("apigateway")
    # GIVEN a fresh account (no logging role) and a template that creates none (the default)
    finding = preflight.check_api_gateway_logging_role(apigateway, Plan(creates_logging_role=False))
    # THEN it is missing, naming the option that creates it
    assert not finding.ok and "create_api_gateway_cloudwatch_role=true" in finding.fix
    # WHEN the account has a role of its own
    role = "arn:aws:iam::123456789012:role/platform-apigw-logs"
    apigateway.update_account(patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": role}])
    # THEN the default template is ready, and one that creates a role is refused: it would replace the account's
    assert preflight.check_api_gateway_logging_role(apigateway, Plan(creates_logging_role=False)).ok
    replacing = preflight.check_api_gateway_logging_role(apigateway, Plan(creates_logging_role=True))
    assert not replacing.ok and role in replacing.detail and "create_api_gateway_cloudwatch_role=false" in replacing.fix


def test_the_cli_checks_the_logging_role_against_the_synthesized_template(
    moto: MotoServer, monkeypatch, capsys, tmp_path
):
    # GIVEN an account with its own API Gateway logging role and a template that would create another
    for name, value in {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": moto.url}.items():
        monkeypatch.setenv(name, value)
    boto3.client("apigateway", region_name=REGION).update_account(
        patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": "arn:aws:iam::1:role/logs"}]
    )
    template = _template(("g5.xlarge", 1, 0))
    template["Resources"]["Account"] = {"Type": "AWS::ApiGateway::Account", "Properties": {}}
    (tmp_path / "t.json").write_text(json.dumps(template))
    # WHEN `make deploy`'s preflight runs THEN the logging role is missing, so cdk deploy does not run
    assert cli.main(["preflight", "--no-docker", "--template", str(tmp_path / "t.json")]) == 1
    assert next(
        line for line in capsys.readouterr().out.splitlines() if " api_gateway_logging_role:" in line
    ).startswith("MISSING")


def test_a_group_with_fallback_types_counts_its_largest_in_the_gpu_quota(client):
    # GIVEN a group of 2 that launches g5.xlarge (4 vCPUs), else g5.4xlarge (16), through its mixed instances policy
    template = _template(("g5.xlarge", 2, 0))
    group = template["Resources"]["Group0"]["Properties"]
    group["MixedInstancesPolicy"] = {
        "LaunchTemplate": {
            "LaunchTemplateSpecification": group.pop("LaunchTemplate"),
            "Overrides": [{"InstanceType": "g5.xlarge"}, {"InstanceType": "g5.4xlarge"}],
        }
    }
    demand = preflight.demand_from_template(template)
    assert demand == [preflight.GpuDemand("g5.xlarge", 2, ("g5.4xlarge",))]
    # WHEN the quota holds two of the first type only
    finding = preflight.check_gpu_quota(client("ec2"), _quota(8), Plan(demand=demand))
    # THEN it is missing: the fallback may be what launches, 2 x 16 vCPUs
    assert not finding.ok and "need 32" in finding.detail and "or g5.4xlarge" in finding.detail
