"""Deploy day (issue 21): what a first `cdk deploy` into a fresh account needs from the template, one test each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cdk.conftest import TEST_CONTEXT
from tests.cdk.helpers import function_role, role_actions

pytestmark = pytest.mark.cdk

DISPATCHER = "lambdas.webhooks.handler.lambda_handler"


def _joined(value: Any) -> str:
    """A string property as CloudFormation would give it, each Ref written as ``<Ref:LogicalId>``."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"<Ref:{value['Ref']}>"
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_joined(part) for part in parts)
    raise AssertionError(f"unexpected intrinsic {value}")


def _dispatcher_env(synthesized) -> dict[str, Any]:
    return synthesized.variables(DISPATCHER)


# --- Defect 2: every tenant's webhook signing secret exists after the deploy ----------------------------------------


def test_each_tenant_gets_a_signing_secret_generated_at_deploy(synthesized):
    """GIVEN two tenants in context WHEN synthesized THEN each has a Secrets Manager secret whose value Secrets
    Manager generates (letters and digits, the base64 of a Standard Webhooks secret), and no secret is deployed empty
    for someone to fill in."""
    secrets = synthesized.resources("AWS::SecretsManager::Secret")
    generated = {lid: r for lid, r in secrets.items() if "GenerateSecretString" in r["Properties"]}
    assert len(generated) == len(TEST_CONTEXT["tenants"])
    for resource in generated.values():
        spec = resource["Properties"]["GenerateSecretString"]
        assert spec["ExcludePunctuation"] is True and spec.get("IncludeSpace", False) is False
        assert spec["PasswordLength"] % 4 == 0 and spec["PasswordLength"] * 3 // 4 >= 24  # >= 24 bytes decoded
        assert "SecretStringTemplate" not in spec
    assert not [lid for lid, r in secrets.items() if "SecretString" in r["Properties"]]


def test_the_dispatcher_finds_each_tenants_secret_and_may_read_exactly_those(synthesized):
    """GIVEN the tenants' secrets WHEN reading the dispatcher THEN WEBHOOK_SECRET_ARNS maps each tenant to its own
    secret, and its role may GetSecretValue on those secrets and nothing else of Secrets Manager."""
    arns = json.loads(_joined(_dispatcher_env(synthesized)["WEBHOOK_SECRET_ARNS"]))
    expected = {
        tenant: f"<Ref:{synthesized.logical_id(secret)}>"
        for tenant, secret in synthesized.stack.service.webhooks.signing_secrets.items()
    }
    assert arns == expected and set(arns) == set(TEST_CONTEXT["tenants"])
    actions = role_actions(synthesized.template, function_role(synthesized.template, DISPATCHER))
    assert sorted(a for a in actions if a.startswith("secretsmanager:")) == ["secretsmanager:GetSecretValue"]
    assert sorted(r["Ref"] for r in actions["secretsmanager:GetSecretValue"]) == sorted(
        v.removeprefix("<Ref:").removesuffix(">") for v in expected.values()
    )


def test_the_operator_finds_the_secrets_in_a_stack_output(synthesized):
    """GIVEN the stack's outputs WHEN an operator looks for a tenant's secret THEN WebhookSigningSecretArns holds the
    same tenant -> ARN map the dispatcher reads (what `python -m async_inference.cli webhook-secret --secret-arns`
    takes)."""
    output = synthesized.json["Outputs"]["WebhookSigningSecretArns"]["Value"]
    assert json.loads(_joined(output)) == json.loads(_joined(_dispatcher_env(synthesized)["WEBHOOK_SECRET_ARNS"]))


# --- Defect 1: the service is created after the capacity provider is associated with the cluster --------------------


def test_the_worker_service_waits_for_the_capacity_provider_association(synthesized):
    """GIVEN the worker service, which places its tasks through the GPU capacity provider WHEN CloudFormation creates
    the stack THEN the service depends on the cluster's ClusterCapacityProviderAssociations (CreateService fails
    before the association exists, and no property orders the two)."""
    [association] = synthesized.resources("AWS::ECS::ClusterCapacityProviderAssociations")
    [service] = synthesized.resources("AWS::ECS::Service").values()
    depends = service.get("DependsOn", [])
    assert association in ([depends] if isinstance(depends, str) else depends)


# --- Defect 7: containers cannot reach the instance metadata service ------------------------------------------------


def test_containers_cannot_take_the_instance_role_through_imds(synthesized):
    """GIVEN the GPU instances' launch template WHEN a bridge-mode container (one hop beyond the instance) asks IMDS
    THEN it gets no answer: IMDSv2 is required and its response hop limit is 1."""
    [template] = synthesized.resources("AWS::EC2::LaunchTemplate").values()
    options = template["Properties"]["LaunchTemplateData"]["MetadataOptions"]
    assert options["HttpTokens"] == "required"
    assert options["HttpPutResponseHopLimit"] == 1


# --- Defect 10: every function on a supported runtime ---------------------------------------------------------------


def test_every_function_runs_python_3_12_or_newer(synthesized):
    """GIVEN every Lambda function of the stack, the CDK's own helper functions included WHEN reading their runtime
    THEN each is a Python of 3.12 or newer (python3.11 runs on Amazon Linux 2, past its end of life in June 2026), and
    the layer is built for the same Python."""
    functions = synthesized.resources("AWS::Lambda::Function")
    python = {
        lid: f["Properties"]["Runtime"]
        for lid, f in functions.items()
        if f["Properties"].get("Runtime", "").startswith("python")
    }
    assert len(python) >= 10  # the service's own functions are among them
    old = {lid: r for lid, r in python.items() if tuple(int(x) for x in r.removeprefix("python").split(".")) < (3, 12)}
    assert old == {}
    [layer] = synthesized.resources("AWS::Lambda::LayerVersion").values()
    layered = {f["Properties"]["Runtime"] for f in functions.values() if f["Properties"].get("Layers")}
    assert layer["Properties"]["CompatibleRuntimes"] == sorted(layered)


# --- Defects 9 and 6: the queue-driven functions ---------------------------------------------------------------------


def _event_sources(synthesized) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(mapping, its queue, its function) for every event source mapping on an SQS queue of the stack."""
    queues = synthesized.resources("AWS::SQS::Queue")
    functions = synthesized.resources("AWS::Lambda::Function")
    found = []
    for mapping in synthesized.resources("AWS::Lambda::EventSourceMapping").values():
        queue = mapping["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
        if queue not in queues:  # a table's stream (the WebSocket delta push): its shards, not a queue, bound it
            continue
        function = mapping["Properties"]["FunctionName"]["Ref"]
        found.append((mapping["Properties"], queues[queue]["Properties"], functions[function]["Properties"]))
    return found


def test_every_sqs_triggered_function_has_six_times_its_timeout_and_a_way_out(synthesized):
    """GIVEN every event source mapping on an SQS queue WHEN its function keeps failing a message THEN the queue hides
    each receive for at least six times the function's timeout (AWS guidance, so a throttled batch is not received
    again while it runs), the function reports item failures (only the failing message returns), and the queue's
    redrive moves the message on after a bounded number of receives, instead of receiving it for 14 days."""
    mappings = _event_sources(synthesized)
    assert len(mappings) >= 5
    for mapping, queue, function in mappings:
        timeout = function.get("Timeout", 3)
        assert queue.get("VisibilityTimeout", 30) >= 6 * timeout, (mapping, queue)
        assert mapping.get("FunctionResponseTypes") == ["ReportBatchItemFailures"], mapping
        assert 1 <= queue["RedrivePolicy"]["maxReceiveCount"] <= 10, queue


def test_every_event_source_mapping_caps_its_concurrency(synthesized):
    """GIVEN a new account's small Lambda concurrency WHEN the queues fill THEN no event source mapping may take more
    than a few concurrent invocations (ScalingConfig.MaximumConcurrency, 2 to 1000), so the API's functions keep
    theirs; together at most 8, plus 2 for each tenant's webhook queue (docs/deploying.md)."""
    caps = [mapping.get("ScalingConfig", {}).get("MaximumConcurrency") for mapping, _, _ in _event_sources(synthesized)]
    assert None not in caps
    assert all(2 <= cap <= 1000 for cap in caps)
    tenants = len(synthesized.stack.service.webhooks.queues)
    assert sum(caps) <= 8 + 2 * tenants, caps


# --- Defect 5: the API does not wait for a GPU ----------------------------------------------------------------------


def _depends_on(template_json: dict[str, Any], logical_id: str) -> set[str]:
    """Every resource CloudFormation must create before ``logical_id`` (Ref, Fn::GetAtt, DependsOn, transitively)."""
    resources = template_json["Resources"]

    def direct(name: str) -> set[str]:
        resource = resources[name]
        depends = resource.get("DependsOn", [])
        text = json.dumps(resource.get("Properties", {}))
        refs = {other for other in resources if f'"Ref": "{other}"' in text or f'["{other}",' in text}
        return (refs | set([depends] if isinstance(depends, str) else depends)) & set(resources)

    seen: set[str] = set()
    pending = [logical_id]
    while pending:
        for other in direct(pending.pop()) - seen:
            seen.add(other)
            pending.append(other)
    return seen


@pytest.mark.parametrize(
    "handler",
    [
        "lambdas.api.handler.lambda_handler",
        "lambdas.upload.handler.lambda_handler",
        "lambdas.batch_controller.handler.lambda_handler",
    ],
)
def test_the_functions_that_wake_the_workers_do_not_wait_for_the_worker_service(synthesized, handler):
    """GIVEN a function that wakes the workers from zero WHEN CloudFormation creates the stack THEN nothing it needs
    (its environment, its role's policies) waits for the ECS service, whose creation waits for a healthy GPU task:
    it finds the service by a name fixed at synth, and its wake policy names the same ARN."""
    template = synthesized.json
    [(logical_id, function)] = synthesized.template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": handler}}
    ).items()
    [service] = synthesized.resources("AWS::ECS::Service")
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    policies = [
        lid for lid, p in synthesized.resources("AWS::IAM::Policy").items() if {"Ref": role} in p["Properties"]["Roles"]
    ]
    for needed in (logical_id, *policies):
        assert service not in _depends_on(template, needed) | {needed}, needed
    variables = synthesized.variables(logical_id)
    assert '/gpu-workers\\"' in json.dumps(variables["MODEL_FLEETS"])  # the route's worker_service
    statements = [
        s
        for lid in policies
        for s in template["Resources"][lid]["Properties"]["PolicyDocument"]["Statement"]
        if "ecs:UpdateService" in s["Action"]
    ]
    [resource] = [s["Resource"] for s in statements]
    assert resource["Fn::Join"][1][-1].endswith("/gpu-workers")
    # the same ARN's references (partition, region, account, the cluster) in the route, none of the service
    references = [part for part in resource["Fn::Join"][1] if not isinstance(part, str)]
    assert references and all(part in variables["MODEL_FLEETS"]["Fn::Join"][1] for part in references)


def test_the_api_stage_does_not_wait_for_the_worker_service(synthesized):
    """GIVEN the REST API's stage (the API is usable once it exists) WHEN CloudFormation creates the stack THEN it
    does not wait for the ECS service either."""
    [service] = synthesized.resources("AWS::ECS::Service")
    for stage in synthesized.resources("AWS::ApiGateway::Stage"):
        assert service not in _depends_on(synthesized.json, stage)


def test_the_workers_can_tell_which_jobs_a_websocket_connection_follows(synthesized):
    """GIVEN the WebSocket push WHEN a worker reports progress THEN it knows the connection table and may Query its
    tenant index (and nothing else of it), to publish job.progress only for followed jobs."""
    push = synthesized.stack.service.push
    table = synthesized.logical_id(push.connections)
    assert synthesized.worker_environment()["CONNECTIONS_TABLE_NAME"] == {"Ref": table}
    role = synthesized.container and synthesized.resources("AWS::ECS::TaskDefinition")
    [task] = role.values()
    actions = role_actions(synthesized.template, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    on_table = {a: r for a, r in actions.items() if table in json.dumps(r)}
    assert list(on_table) == ["dynamodb:Query"]
    assert "/index/" in json.dumps(on_table["dynamodb:Query"])


def test_a_worker_may_ask_whether_a_newer_deployment_of_its_own_service_waits(synthesized):
    """GIVEN the worker task role WHEN reading its DescribeServices grant THEN it names this stack's worker service
    only (gpu_worker.deployments: without it a worker never learns of a deployment and holds protection, defect 4)."""
    [task] = synthesized.resources("AWS::ECS::TaskDefinition").values()
    actions = role_actions(synthesized.template, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    [resource] = actions["ecs:DescribeServices"]
    [service] = synthesized.resources("AWS::ECS::Service").values()
    assert _joined(resource).endswith(f"/{service['Properties']['ServiceName']}")


# --- Defect 12: the zones are the platform team's to choose ---------------------------------------------------------


def test_the_gpu_instances_go_to_the_zones_given_in_context(synth_variant):
    """GIVEN availability_zones in context (zones that offer the GPU type, as the preflight lists them) WHEN
    synthesized THEN every subnet lies in one of them, and the GPU instances' group spans all of them."""
    variant = synth_variant(availability_zones='["us-east-1c", "us-east-1d"]')
    zones = {s["Properties"]["AvailabilityZone"] for s in variant.resources("AWS::EC2::Subnet").values()}
    assert zones == {"us-east-1c", "us-east-1d"}
    [group] = variant.resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert len(group["Properties"]["VPCZoneIdentifier"]) == 2


def test_a_zone_named_twice_is_refused_naming_the_option(synth_variant):
    with pytest.raises(Exception, match="availability_zones"):
        synth_variant(availability_zones='["us-east-1c", "us-east-1c"]')


# --- Defect 13: an option that pays nothing for the network while scaled to zero ------------------------------------


def test_public_worker_subnets_remove_the_nat_gateway_and_the_interface_endpoints(synth_variant):
    """GIVEN worker_subnets=public WHEN synthesized THEN there is no NAT gateway, no interface endpoint (the idle
    floor's network items), the S3 and DynamoDB gateway endpoints stay (free), and the instances get public addresses
    behind a security group without any inbound rule."""
    variant = synth_variant(worker_subnets="public")
    assert variant.resources("AWS::EC2::NatGateway") == {}
    endpoints = variant.resources("AWS::EC2::VPCEndpoint").values()
    assert sorted(e["Properties"].get("VpcEndpointType", "Gateway") for e in endpoints) == ["Gateway", "Gateway"]
    [template] = variant.resources("AWS::EC2::LaunchTemplate").values()
    [interface] = template["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert interface["AssociatePublicIpAddress"] is True
    [group] = variant.resources("AWS::EC2::SecurityGroup").values()
    assert "SecurityGroupIngress" not in group["Properties"]
    assert variant.resources("AWS::EC2::SecurityGroupIngress") == {}
    subnets = variant.resources("AWS::EC2::Subnet").values()
    assert all(s["Properties"]["MapPublicIpOnLaunch"] for s in subnets)


def test_the_default_keeps_the_workers_private_behind_one_nat_gateway(synthesized):
    """GIVEN the defaults WHEN synthesized THEN the instances are private: one NAT gateway, three interface endpoints
    (ECR API, ECR Docker, CloudWatch Logs) in each of two zones; what that costs idle is in docs/deploying.md."""
    assert len(synthesized.resources("AWS::EC2::NatGateway")) == 1
    interface = [
        e
        for e in synthesized.resources("AWS::EC2::VPCEndpoint").values()
        if e["Properties"].get("VpcEndpointType") == "Interface"
    ]
    assert len(interface) == 3 and all(len(e["Properties"]["SubnetIds"]) == 2 for e in interface)


def test_private_subnets_without_a_nat_gateway_are_refused_naming_the_way_out(synth_variant):
    with pytest.raises(Exception, match="worker_subnets"):
        synth_variant(nat_gateways=0)
