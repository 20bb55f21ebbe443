"""The AWS quotas a template meets only at deploy (cdk.limits): the test app's stacks within them, and the reader's
counting."""

from __future__ import annotations

import json

from cdk import limits


def test_every_stack_of_the_test_app_is_within_awss_deploy_time_quotas(synthesized):
    """GIVEN the test app synthesized (two tenants, one model) WHEN each template of its assembly is read THEN none
    passes CloudFormation's resource, output, parameter or size quota, nor any function Lambda's 4 KB environment."""
    templates = sorted(synthesized.outdir.glob("*.template.json"))
    assert templates
    for path in templates:
        figures = limits.figures(json.loads(path.read_text()), path.stat().st_size)
        assert figures.resources > 100 and figures.largest_environment  # the stack itself, read
        assert figures.over() == [], path.name


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
