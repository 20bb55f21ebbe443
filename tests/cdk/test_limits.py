"""The AWS quotas a template meets only at deploy (cdk.limits): the test app's stacks within them, and the reader's
counting."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Stack

from app import build, synth
from cdk import limits, tenant_stacks
from tests.cdk.conftest import cdk_json_context
from tests.cdk.helpers import function_role, role_actions

# Each tenant's resources in its nested stack: its API key, usage plan and usage-plan key, signing secret, catalog
# parameter, webhook queue, the queue's policy, its subscription to the result topic and its event source.
TENANT_RESOURCES = 9


def test_every_stack_of_the_test_app_is_within_awss_deploy_time_quotas(synthesized):
    """GIVEN the test app synthesized (two tenants, one model) WHEN each template of its assembly is read THEN none
    passes CloudFormation's resource, output, parameter or size quota, nor any function Lambda's 4 KB environment."""
    found = limits.assembly_figures(synthesized.outdir)
    root = found[synthesized.stack.template_file]
    assert root.resources > 100 and root.largest_environment  # the stack itself, read
    for name, figures in found.items():
        assert figures.over() == [], name


def test_a_hundred_tenants_in_nested_stacks_and_four_models_are_within_every_quota(synth_variant):
    """GIVEN 100 tenants spread over 4 nested stacks (tenant_stacks) and 4 models WHEN every template of the assembly
    is read (the root's and each nested stack's) THEN each holds a share of the tenants' resources, and none passes a
    CloudFormation quota nor any function Lambda's environment quota."""
    synthesized = synth_variant(**limits.synthetic_context(100, 4, tenant_stacks=4))
    found = limits.assembly_figures(synthesized.outdir)
    nested = {name: figures for name, figures in found.items() if name.endswith(".nested.template.json")}
    assert len(nested) == 4
    assert sum(figures.resources for figures in nested.values()) == 100 * TENANT_RESOURCES
    for name, figures in found.items():
        assert figures.over() == [], name


def test_a_hundred_tenants_and_eight_models_each_fleet_in_a_nested_stack_are_within_every_quota(synth_variant):
    """GIVEN 100 tenants over 4 nested stacks and 8 models, each model's fleet in a nested stack of its own
    (fleet_stacks) WHEN every template of the assembly is read THEN every fleet, the first included, is in its own
    stack with its own cluster and worker service, none in the root, and no template passes a CloudFormation quota,
    Lambda's environment quota or IAM's inline policy quota."""
    synthesized = synth_variant(**limits.synthetic_context(100, 8, tenant_stacks=4, fleet_stacks=True))
    found = limits.assembly_figures(synthesized.outdir)
    services = {
        path.name: sum(r["Type"] in ("AWS::ECS::Service", "AWS::ECS::Cluster") for r in resources.values())
        for path in synthesized.outdir.glob("*.template.json")
        for resources in [json.loads(path.read_text())["Resources"]]
    }
    assert sorted(services.values()) == [0] * 4 + [1] + [2] * 8  # tenants' stacks; the root (its VPC's cluster)
    assert len(found) == 1 + 4 + 8
    for name, figures in found.items():
        assert figures.over() == [], name


def test_a_tenants_nested_stack_does_not_move_when_another_tenant_is_added(synth_variant):
    """GIVEN six tenants over three nested stacks WHEN a seventh is added THEN each of the six keeps its API key in
    the same nested stack's template (moving it would replace its key, and its clients' key value)."""

    def stack_of_each_key(tenants: int) -> dict[str, str]:
        synthesized = synth_variant(**limits.synthetic_context(tenants, 1, tenant_stacks=3))
        return {
            resource["Properties"]["Name"]: path.name
            for path in synthesized.outdir.glob("*.nested.template.json")
            for resource in json.loads(path.read_text())["Resources"].values()
            if resource["Type"] == "AWS::ApiGateway::ApiKey"
        }

    six, seven = stack_of_each_key(6), stack_of_each_key(7)
    assert len(set(six.values())) > 1  # spread, not all in one
    assert {tenant: seven[tenant] for tenant in six} == six


def test_a_stack_over_500_resources_is_refused_naming_the_option_that_nests_the_tenants(worker_context, tmp_path):
    """GIVEN 30 tenants in the stack itself (tenant_stacks 0) WHEN the app is synthesized THEN the synth is refused
    with the stack's resource count and the option to set, not only the CDK's count."""
    context = {**cdk_json_context(), "worker_image_context": str(worker_context), **limits.synthetic_context(30, 1)}
    app = App(context=context, outdir=str(tmp_path))
    build(app)
    with pytest.raises(ValueError, match=r"holds \d+ resources, over CloudFormation's 500.*set tenant_stacks"):
        synth(app)


def test_with_tenants_in_nested_stacks_the_dispatchers_grants_do_not_grow_with_the_tenants(synth_variant):
    """GIVEN 100 tenants in nested stacks WHEN the dispatcher's role is read THEN it may read the signing secrets and
    consume the webhook queues by one name prefix each, not a list of ARNs (IAM allows a role 10,240 bytes of inline
    policy, which 100 tenants' ARNs pass)."""
    synthesized = synth_variant(**limits.synthetic_context(100, 4, tenant_stacks=4))
    role = role_actions(
        synthesized.template, function_role(synthesized.template, "lambdas.webhooks.handler.lambda_handler")
    )
    assert len(role["secretsmanager:GetSecretValue"]) == 1
    assert len(role["sqs:ReceiveMessage"]) == 1


def test_with_tenants_in_nested_stacks_the_workers_name_each_webhook_queue_by_the_url_of_its_name(synth_variant):
    """GIVEN three tenants in nested stacks WHEN the worker's WEBHOOK_QUEUE_URLS is read THEN each tenant's URL is
    SQS's for the name its queue is created with, built from that name and the pseudo parameters (no reference to
    the tenants' stacks, which a fleet's own stack would wait on: fleet_stacks)."""
    synthesized = synth_variant(**limits.synthetic_context(3, 1, tenant_stacks=2))
    names = {
        resource["Properties"]["QueueName"].rsplit("-", 1)[-1]: resource["Properties"]["QueueName"]
        for path in synthesized.outdir.glob("*.nested.template.json")
        for resource in json.loads(path.read_text())["Resources"].values()
        if resource["Type"] == "AWS::SQS::Queue"
    }
    [definition] = synthesized.template.find_resources("AWS::ECS::TaskDefinition").values()
    [variable] = [
        v
        for v in definition["Properties"]["ContainerDefinitions"][0]["Environment"]
        if v["Name"] == "WEBHOOK_QUEUE_URLS"
    ]
    resolved = json.dumps(variable["Value"])
    assert sorted(names) == ["0", "1", "2"]
    for name in names.values():
        assert f"/{name}" in resolved
    assert "Outputs." not in resolved and '"Ref": "AWS::URLSuffix"' in resolved


def test_each_quota_passed_is_named_with_its_figure():
    """GIVEN a template of 501 resources, one a function whose environment resolves past 4 KB WHEN its figures are
    read THEN both quotas are named, with the figure and the quota."""
    big = {"A" * 20: "x" * 3950, "QUEUE": {"Fn::GetAtt": ["Queue", "Arn"]}}
    resources = {f"R{n}": {"Type": "AWS::SQS::Queue"} for n in range(500)}
    resources["Fn"] = {"Type": "AWS::Lambda::Function", "Properties": {"Environment": {"Variables": big}}}
    over = limits.figures({"Resources": resources}).over()
    assert over == [
        f"resources: 501 over {limits.MAX_RESOURCES}",
        f"environment bytes of Fn: {20 + 3950 + 5 + limits.RESOLVED_TOKEN_BYTES} over {limits.MAX_ENVIRONMENT_BYTES}",
    ]


def test_an_environment_counts_references_as_resolved_and_joins_by_their_parts():
    """GIVEN a variable joining a literal, a pseudo parameter and a reference WHEN its resolved size is counted THEN
    the literal counts as written, the region as its longest name, the reference as a resolved ARN or URL."""
    value = {"Fn::Join": ["", ["https://", {"Ref": "AWS::Region"}, {"Ref": "Queue"}]]}
    assert limits.resolved_bytes(value) == len("https://") + 14 + limits.RESOLVED_TOKEN_BYTES


def test_a_roles_inline_policies_count_together_with_references_as_resolved():
    """GIVEN a role with a policy of its own and an AWS::IAM::Policy attached to it, whose resource is a reference
    WHEN its inline policy size is counted THEN both documents count, as compact JSON, the reference as a resolved
    ARN; and past IAM's 10,240 characters the role is named."""
    own = {"Statement": [{"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*"}]}
    attached = {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": {"Fn::GetAtt": ["B", "Arn"]}}]}
    resources = {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {"Policies": [{"PolicyDocument": own}]}},
        "Policy": {"Type": "AWS::IAM::Policy", "Properties": {"Roles": [{"Ref": "Role"}], "PolicyDocument": attached}},
    }
    resolved = {**attached["Statement"][0], "Resource": "r" * limits.RESOLVED_TOKEN_BYTES}
    expected = len(json.dumps(own, separators=(",", ":"))) + len(
        json.dumps({"Statement": [resolved]}, separators=(",", ":"))
    )
    assert limits.role_policy_bytes(resources) == {"Role": expected}
    own["Statement"][0]["Resource"] = "x" * limits.MAX_ROLE_POLICY_BYTES
    assert limits.figures({"Resources": resources}).over()[0].startswith("inline policy bytes of Role:")


def _largest_environment(synthesized) -> tuple[int, str]:
    path = synthesized.outdir / synthesized.stack.template_file
    found = limits.figures(json.loads(path.read_text()))
    return found.largest_environment_bytes, found.largest_environment


def test_no_function_environment_grows_with_the_tenants_or_the_models(synth_variant):
    """GIVEN the app with 2 tenants and 1 model, and with 6 tenants and 3 models WHEN each template's function
    environments are read THEN the largest is as large in both: the tenants' keys, quotas and secrets and the models'
    routes and names are read from the deployment's catalog (cdk.catalog), not from the environment."""
    few = _largest_environment(synth_variant(**limits.synthetic_context(2, 1)))
    many = _largest_environment(synth_variant(**limits.synthetic_context(6, 3)))
    assert many == few
    assert few[0] <= limits.MAX_ENVIRONMENT_BYTES


def test_more_tenants_than_a_nested_stack_holds_are_refused_naming_tenant_stacks():
    """GIVEN one nested stack for more tenants than one holds WHEN the tenant stacks are built THEN the synth is
    refused, naming tenant_stacks and the most a nested stack holds."""
    tenants = [f"tenant-{n}" for n in range(tenant_stacks.MAX_TENANTS_PER_STACK + 1)]
    with pytest.raises(
        ValueError,
        match=rf"tenant_stacks = 1 places {len(tenants)} tenants.*at most {tenant_stacks.MAX_TENANTS_PER_STACK}.*raise",
    ):
        tenant_stacks.TenantStacks(Stack(App(), "S"), "Tenants", tenants=tenants, count=1)
