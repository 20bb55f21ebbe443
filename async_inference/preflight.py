"""``async-inference preflight``: what a first ``cdk deploy`` into an account needs, checked before it runs.

Each check reads the account (with the caller's AWS credentials and region) or this machine and gives a ``Finding``:
what it saw, and when something is missing, how to fix it. The checks, and what answers them:

* ``gpu_quota``: the EC2 quota "Running On-Demand G and VT instances" (Service Quotas, ``L-DB2E81BA``, counted in
  vCPUs) against what every GPU fleet may run at once: with ``--template`` (what ``make deploy`` passes), each Auto
  Scaling group of the synthesized template, its MaxSize plus its warm pool's instances (they run while they
  pre-initialize, and a released instance's replacement initializes while its group is at its maximum), times its
  type's vCPUs (EC2 DescribeInstanceTypes); without it ``instances`` x one type. New accounts often have 0: no GPU
  instance launches (the API still deploys and jobs queue: docs/deploying.md).
* ``ecs_service_linked_role``: the role ``AWSServiceRoleForECS`` (IAM GetRole), which the capacity provider's managed
  scaling needs; an account that never used ECS may lack it.
* ``lambda_concurrency``: the account's Lambda concurrency (GetAccountSettings) against ``MIN_LAMBDA_CONCURRENCY``.
  New accounts get 10; the queue-driven functions may take 8 at once, plus 2 per tenant (their event sources' caps),
  beside the API's. Below it the preflight fails (exit status 1), so ``make deploy`` stops before ``cdk deploy``.
* ``zones``: the zones that offer the GPU type (EC2 DescribeInstanceTypeOfferings), against the zones the VPC will
  use (``availability_zones``, or the region's first two, which is what the stack takes without it).
* ``bootstrap``: the CDK bootstrap stack (CloudFormation ``CDKToolkit``) and its version parameter (SSM
  ``/cdk-bootstrap/<qualifier>/version``), at least the version the synthesized assets require.
* ``api_gateway_logging_role`` (with ``--template``): the account's API Gateway logging role (GetAccount), one per
  account and region, against whether the template creates one (``create_api_gateway_cloudwatch_role``): a role there
  would be replaced for every API of the region; none there and none created fails the deploy at the stage.
* ``docker``: a Docker engine answering, with buildx; ``image_platform``: the worker image's platform (amd64 for g5)
  against this machine's, and whether buildx can build it (an emulated build is slow, and fails without QEMU).

Nothing here changes the account. ``tests/local/test_preflight.py`` runs the checks against moto server where moto
answers them (zones, vCPUs, bootstrap) and against botocore's Stubber, which validates each answer against the API's
own model, where it does not (Service Quotas for EC2, Lambda's account settings), and a stand-in ``docker`` for the
Docker checks.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

G_AND_VT_QUOTA_CODE = "L-DB2E81BA"  # EC2: Running On-Demand G and VT instances (vCPUs)
LAMBDA_CONCURRENCY_QUOTA_CODE = "L-B99A9384"  # Lambda: Concurrent executions
# The queue-driven functions' event source caps (11, tests/cdk/test_deploy_day.py) plus room for the API, its
# authorizer and the push functions under load. The account must also keep 10 unreserved; AWS's usual default is 1000.
MIN_LAMBDA_CONCURRENCY = 50
BOOTSTRAP_STACK = "CDKToolkit"
BOOTSTRAP_QUALIFIER = "hnb659fds"
# What the stack's assets require (the manifest's requiresBootstrapStackVersion for the default synthesizer).
MIN_BOOTSTRAP_VERSION = 6
# The zones the stack uses without availability_zones: the region's first two (cdk/gpu_worker_service.py, max_azs=2).
DEFAULT_ZONE_COUNT = 2
ECS_SERVICE_LINKED_ROLE = "AWSServiceRoleForECS"
# The instance families the G and VT quota counts (g3 to g6e, g5g, gr6, vt1: EC2's "Running On-Demand G and VT
# instances"); P instances have a quota of their own.
G_AND_VT_FAMILIES = ("g", "vt")


@dataclass(frozen=True)
class GpuDemand:
    """One GPU fleet's most instances running at once, of one type."""

    instance_type: str
    instances: int
    # Types the group launches when EC2 has none of ``instance_type`` (its mixed instances policy's other overrides):
    # the quota must hold the largest.
    fallbacks: tuple[str, ...] = ()

    @property
    def in_g_and_vt_quota(self) -> bool:
        return self.instance_type.split(".")[0].startswith(G_AND_VT_FAMILIES)


def demand_from_template(template: dict[str, Any]) -> list[GpuDemand]:
    """Each Auto Scaling group of a synthesized template: its launch template's instance type, and its MaxSize plus
    its warm pool's instances (MaxGroupPreparedCapacity, else MinSize)."""
    resources = template.get("Resources", {})
    pools: dict[str, int] = {}
    for pool in (r for r in resources.values() if r["Type"] == "AWS::AutoScaling::WarmPool"):
        props = pool["Properties"]
        group = props["AutoScalingGroupName"]["Ref"]
        pools[group] = int(props.get("MaxGroupPreparedCapacity", props.get("MinSize", 0)))
    demand = []
    for logical_id, group in sorted(resources.items()):
        if group["Type"] != "AWS::AutoScaling::AutoScalingGroup":
            continue
        props = group["Properties"]
        mixed = props.get("MixedInstancesPolicy", {}).get("LaunchTemplate")
        reference = mixed["LaunchTemplateSpecification"] if mixed else props["LaunchTemplate"]
        launch = resources[reference["LaunchTemplateId"]["Ref"]]
        types = [o["InstanceType"] for o in mixed.get("Overrides", [])] if mixed else []
        instance_type = types[0] if types else launch["Properties"]["LaunchTemplateData"]["InstanceType"]
        instances = int(props["MaxSize"]) + pools.get(logical_id, 0)
        demand.append(GpuDemand(instance_type, instances, tuple(types[1:])))
    return demand


@dataclass(frozen=True)
class Finding:
    """One check's outcome: ``ok``, what it saw, and how to fix it when not ok."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Plan:
    """What the deploy will ask of the account: the GPU type, how many instances at most (with any deployment
    spares), the zones (empty: the region's first two)."""

    instance_type: str = "g5.xlarge"
    instances: int = 2
    # Every fleet's demand (``demand_from_template``); empty: ``instances`` of ``instance_type``.
    demand: Sequence[GpuDemand] = ()
    zones: Sequence[str] = ()
    region: str | None = None
    qualifier: str = BOOTSTRAP_QUALIFIER
    min_bootstrap_version: int = MIN_BOOTSTRAP_VERSION
    min_lambda_concurrency: int = MIN_LAMBDA_CONCURRENCY
    # Whether the template creates API Gateway's account logging role (create_api_gateway_cloudwatch_role); None:
    # no template read, not checked.
    creates_logging_role: bool | None = None

    @property
    def gpu_demand(self) -> list[GpuDemand]:
        return list(self.demand) or [GpuDemand(self.instance_type, self.instances)]

    @property
    def arm64(self) -> bool:
        """A Graviton type (g5g): its family ends in "g" (cdk.gpu_worker_service.is_arm64 asks CDK the same)."""
        family = self.instance_type.split(".")[0]
        return len(family) > 1 and family.endswith("g")

    @property
    def image_platform(self) -> str:
        """The worker image's Docker platform (cdk.gpu_worker_service.image_platform, without importing CDK)."""
        return "linux/arm64" if self.arm64 else "linux/amd64"


def _error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)


def check_gpu_quota(ec2: Any, quotas: Any, plan: Plan) -> Finding:
    """The G and VT vCPU quota against what every fleet's instances (warm pools included) need at once."""
    counted = [d for d in plan.gpu_demand if d.in_g_and_vt_quota]
    types = sorted({t for d in counted for t in (d.instance_type, *d.fallbacks)})
    described = ec2.describe_instance_types(InstanceTypes=types)["InstanceTypes"] if types else []
    vcpus = {t["InstanceType"]: t["VCpuInfo"]["DefaultVCpus"] for t in described}
    largest = {d: max(vcpus[t] for t in (d.instance_type, *d.fallbacks)) for d in counted}
    needed = sum(largest[d] * d.instances for d in counted)
    what = " + ".join(
        f"{d.instances} x {d.instance_type}"
        + (f" or {' or '.join(d.fallbacks)} (at most {largest[d]} vCPUs)" if d.fallbacks else f" ({largest[d]} vCPUs)")
        for d in counted
    )
    if not counted:
        return Finding("gpu_quota", True, "no G or VT instance type in the plan")
    try:
        value = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=G_AND_VT_QUOTA_CODE)["Quota"]["Value"]
    except Exception as exc:  # an account or region Service Quotas cannot answer for: say so, do not guess
        return Finding(
            "gpu_quota",
            False,
            f"could not read the quota ({_error_code(exc)}); {what} need {needed}",
            f"check 'Running On-Demand G and VT instances' ({G_AND_VT_QUOTA_CODE}) in the Service Quotas "
            f"console: it must be at least {needed} vCPUs",
        )
    if value >= needed:
        return Finding("gpu_quota", True, f"{value:g} vCPUs of G and VT instances allowed; {what} need {needed}")
    return Finding(
        "gpu_quota",
        False,
        f"{value:g} vCPUs of G and VT instances allowed; {what} need {needed}: instances beyond it never launch "
        "(jobs stay queued)",
        f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {G_AND_VT_QUOTA_CODE} "
        f"--desired-value {needed}"
        + (f" --region {plan.region}" if plan.region else "")
        + " (approval can take a day; or lower max_gpu_instances or gpu_warm_pool_instances)",
    )


def check_service_linked_role(iam: Any) -> Finding:
    """ECS's service-linked role, which capacity providers with managed scaling act through."""
    try:
        iam.get_role(RoleName=ECS_SERVICE_LINKED_ROLE)
    except Exception as exc:
        if _error_code(exc) != "NoSuchEntity":
            raise
        return Finding(
            "ecs_service_linked_role",
            False,
            f"no {ECS_SERVICE_LINKED_ROLE} in this account: the GPU capacity provider cannot be created without it",
            "aws iam create-service-linked-role --aws-service-name ecs.amazonaws.com",
        )
    return Finding("ecs_service_linked_role", True, f"{ECS_SERVICE_LINKED_ROLE} exists")


def creates_logging_role(template: dict[str, Any]) -> bool:
    """Whether a synthesized template sets API Gateway's account logging role (an ``AWS::ApiGateway::Account``)."""
    return any(r["Type"] == "AWS::ApiGateway::Account" for r in template.get("Resources", {}).values())


def check_api_gateway_logging_role(apigateway: Any, plan: Plan) -> Finding:
    """The account's API Gateway logging role (GetAccount's cloudwatchRoleArn, one per account and region) against
    what the template does with it: a role there would be replaced, for every API of the region; with none there
    and none created, the stage's logs cannot be turned on and the deploy fails."""
    existing = apigateway.get_account().get("cloudwatchRoleArn")
    option = "create_api_gateway_cloudwatch_role"
    if plan.creates_logging_role and existing:
        return Finding(
            "api_gateway_logging_role",
            False,
            f"the account already logs API Gateway with {existing}; this deploy would replace it for every API "
            "of the region",
            f"-c {option}=false (cdk.json's context), synthesize again",
        )
    if not plan.creates_logging_role and not existing:
        return Finding(
            "api_gateway_logging_role",
            False,
            "no API Gateway logging role in this account and region: the stage's access and error logs cannot be "
            "turned on, and the deploy would fail at the stage",
            f"-c {option}=true for this account's first deploy (the stack creates the role), or set one: aws "
            "apigateway update-account --patch-operations op=replace,path=/cloudwatchRoleArn,value=<role ARN>",
        )
    return Finding("api_gateway_logging_role", True, f"logging role: {existing or 'created by this stack'}")


def check_lambda_concurrency(lambda_: Any, plan: Plan) -> Finding:
    """The account's concurrent executions against ``plan.min_lambda_concurrency``."""
    try:
        limit = lambda_.get_account_settings()["AccountLimit"]["ConcurrentExecutions"]
    except Exception as exc:
        return Finding(
            "lambda_concurrency",
            False,
            f"could not read the account's Lambda settings ({_error_code(exc)})",
            f"check 'Concurrent executions' ({LAMBDA_CONCURRENCY_QUOTA_CODE}) in the Service Quotas console: "
            f"at least {plan.min_lambda_concurrency}",
        )
    if limit >= plan.min_lambda_concurrency:
        return Finding("lambda_concurrency", True, f"{limit} concurrent Lambda executions")
    return Finding(
        "lambda_concurrency",
        False,
        f"{limit} concurrent Lambda executions (a new account's): the queue-driven functions may take 8 at once, "
        "plus 2 per tenant, which would throttle the API",
        f"aws service-quotas request-service-quota-increase --service-code lambda --quota-code "
        f"{LAMBDA_CONCURRENCY_QUOTA_CODE} --desired-value 1000 (at least {plan.min_lambda_concurrency})",
    )


def check_zones(ec2: Any, plan: Plan) -> Finding:
    """Whether the zones the VPC will use offer the GPU type."""
    offerings = ec2.describe_instance_type_offerings(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [plan.instance_type]}]
    )["InstanceTypeOfferings"]
    offered = sorted({o["Location"] for o in offerings})
    if plan.zones:
        used, how = list(plan.zones), "availability_zones"
    else:
        zones = ec2.describe_availability_zones(Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}])
        used = sorted(z["ZoneName"] for z in zones["AvailabilityZones"] if z.get("State") == "available")[
            :DEFAULT_ZONE_COUNT
        ]
        how = "the region's first two zones (no availability_zones given)"
    missing = [z for z in used if z not in offered]
    if not offered:
        return Finding(
            "zones",
            False,
            f"no zone of this region offers {plan.instance_type}",
            "choose another region or gpu_instance_type",
        )
    if not missing:
        return Finding("zones", True, f"{plan.instance_type} is offered in {', '.join(used)} ({how})")
    suggestion = json.dumps(offered[:DEFAULT_ZONE_COUNT])
    return Finding(
        "zones",
        False,
        f"{plan.instance_type} is not offered in {', '.join(missing)} of {how}; it is in {', '.join(offered)}: "
        "the capacity provider would launch nothing there",
        f"cdk deploy -c availability_zones='{suggestion}' (or set it in cdk.json's context)",
    )


def check_bootstrap(cloudformation: Any, ssm: Any, plan: Plan) -> Finding:
    """The CDK bootstrap stack and its version."""
    fix = "npx cdk bootstrap aws://<account>/<region>"
    try:
        stack = cloudformation.describe_stacks(StackName=BOOTSTRAP_STACK)["Stacks"][0]
    except Exception as exc:
        if _error_code(exc) != "ValidationError":
            raise
        return Finding(
            "bootstrap", False, f"no {BOOTSTRAP_STACK} stack: this account and region are not bootstrapped", fix
        )
    if stack["StackStatus"] not in ("CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE"):
        return Finding("bootstrap", False, f"{BOOTSTRAP_STACK} is {stack['StackStatus']}", fix)
    name = f"/cdk-bootstrap/{plan.qualifier}/version"
    try:
        version = int(ssm.get_parameter(Name=name)["Parameter"]["Value"])
    except Exception as exc:
        if _error_code(exc) != "ParameterNotFound":
            raise
        return Finding("bootstrap", False, f"{BOOTSTRAP_STACK} exists but {name} does not", fix)
    if version < plan.min_bootstrap_version:
        return Finding(
            "bootstrap",
            False,
            f"bootstrap version {version}; the assets need {plan.min_bootstrap_version}",
            fix + " (updates the bootstrap stack)",
        )
    return Finding("bootstrap", True, f"{BOOTSTRAP_STACK} at version {version}")


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def check_docker(plan: Plan, run: Runner = _run, machine: str | None = None) -> list[Finding]:
    """A Docker engine with buildx, and whether it builds the worker image's platform on this machine."""
    if shutil.which("docker") is None:
        return [
            Finding(
                "docker",
                False,
                "no docker command on PATH: cdk deploy builds the worker image with it",
                "install Docker (Engine or Desktop) with the buildx plugin",
            )
        ]
    engine = run(["docker", "version", "--format", "{{.Server.Version}}"])
    if engine.returncode != 0:
        return [
            Finding(
                "docker",
                False,
                f"the Docker engine does not answer: {engine.stderr.strip()[:200]}",
                "start the Docker daemon (or Docker Desktop), and check this user may use it",
            )
        ]
    buildx = run(["docker", "buildx", "inspect", "--bootstrap"])
    if buildx.returncode != 0:
        return [
            Finding(
                "docker",
                False,
                f"Docker {engine.stdout.strip()} has no working buildx",
                "install the docker-buildx plugin",
            )
        ]
    findings = [Finding("docker", True, f"Docker {engine.stdout.strip()} with buildx")]
    host = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}.get(
        (machine or platform.machine()).lower(), machine or platform.machine()
    )
    platforms = next(
        (line.split(":", 1)[1] for line in buildx.stdout.splitlines() if line.strip().startswith("Platforms:")), ""
    )
    available = {p.strip().rstrip("*") for p in platforms.split(",") if p.strip()}
    if plan.image_platform == host:
        findings.append(Finding("image_platform", True, f"the worker image ({plan.image_platform}) builds natively"))
    elif plan.image_platform in available:
        findings.append(
            Finding(
                "image_platform",
                True,
                f"the worker image ({plan.image_platform}) builds under "
                f"emulation on this {host} machine: expect a slow first build",
            )
        )
    else:
        findings.append(
            Finding(
                "image_platform",
                False,
                f"the worker image is {plan.image_platform} (for {plan.instance_type}) and this {host} machine's builder "
                f"offers {', '.join(sorted(available)) or 'no other platform'}",
                "docker run --privileged --rm tonistiigi/binfmt --install all (QEMU emulation), or deploy from a "
                f"{plan.image_platform} machine (a CI runner)",
            )
        )
    return findings


def run_checks(plan: Plan, client: Callable[[str], Any], *, docker: bool = True, run: Runner = _run) -> list[Finding]:
    """Every check, with boto3 clients from ``client(service_name)``; a check that fails to run is a finding too."""
    ec2 = client("ec2")
    checks: list[tuple[str, Callable[[], Finding]]] = [
        ("gpu_quota", lambda: check_gpu_quota(ec2, client("service-quotas"), plan)),
        ("ecs_service_linked_role", lambda: check_service_linked_role(client("iam"))),
        ("lambda_concurrency", lambda: check_lambda_concurrency(client("lambda"), plan)),
        ("zones", lambda: check_zones(ec2, plan)),
        ("bootstrap", lambda: check_bootstrap(client("cloudformation"), client("ssm"), plan)),
    ]
    if plan.creates_logging_role is not None:
        checks.append(("api_gateway_logging_role", lambda: check_api_gateway_logging_role(client("apigateway"), plan)))
    findings = []
    for name, check in checks:
        try:
            findings.append(check())
        except Exception as exc:
            said = " ".join(str(exc).split())[:200]
            findings.append(
                Finding(
                    name,
                    False,
                    f"could not check: {type(exc).__name__}: {said}",
                    "check the AWS credentials and region this command runs with",
                )
            )
    if docker:
        findings.extend(check_docker(plan, run))
    return findings


def report(findings: Sequence[Finding], out: Any = None) -> int:
    """Print each finding (and its fix) to ``out`` (stdout); 0 when every check passed, 1 otherwise."""
    out = out or sys.stdout
    for finding in findings:
        print(f"{'ok  ' if finding.ok else 'MISSING'} {finding.check}: {finding.detail}", file=out)
        if not finding.ok and finding.fix:
            print(f"        fix: {finding.fix}", file=out)
    missing = [f.check for f in findings if not f.ok]
    print(
        f"\n{len(findings) - len(missing)} of {len(findings)} checks passed"
        + (f"; missing: {', '.join(missing)}" if missing else ": ready for cdk deploy"),
        file=out,
    )
    return 1 if missing else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--instance-type", default="g5.xlarge", help="gpu_instance_type (g5.xlarge)")
    parser.add_argument(
        "--instances", type=int, default=2, help="max_gpu_instances, plus deployment_spare_instances (2)"
    )
    parser.add_argument("--zones", default="", help="availability_zones, comma-separated (default: the first two)")
    parser.add_argument("--no-docker", action="store_true", help="skip the Docker checks (a machine that only reads)")
    parser.add_argument(
        "--template",
        default="",
        help="a synthesized template (cdk.out/AsyncInference.template.json): every GPU fleet and warm pool counted "
        "in the quota instead of --instance-type and --instances",
    )


def plan_from(args: argparse.Namespace, region: str | None) -> Plan:
    demand: list[GpuDemand] = []
    logging_role = None
    if getattr(args, "template", ""):
        with open(args.template) as file:
            template = json.load(file)
        demand, logging_role = demand_from_template(template), creates_logging_role(template)
    first = demand[0] if demand else GpuDemand(args.instance_type, args.instances)
    return Plan(
        instance_type=first.instance_type,  # the first fleet's: the worker image's platform
        instances=args.instances,
        demand=demand,
        region=region,
        zones=tuple(z.strip() for z in args.zones.split(",") if z.strip()),
        creates_logging_role=logging_role,
    )


def main(argv: list[str] | None = None, client: Callable[[str], Any] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="async-inference preflight", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv), client)


def run(args: argparse.Namespace, client: Callable[[str], Any] | None = None) -> int:
    """The checks ``args`` ask for, with ``client`` (default: boto3 clients of the caller's session); the exit
    status."""
    region = None
    if client is None:
        import boto3

        session = boto3.session.Session()
        client, region = session.client, session.region_name
    return report(run_checks(plan_from(args, region), client, docker=not args.no_docker))


if __name__ == "__main__":
    sys.exit(main())
