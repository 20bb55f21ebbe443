"""The intrinsics and the dependency order the local deployer relies on, on small templates."""

from __future__ import annotations

import pytest

from local_runtime.template import LOCAL_ACCOUNT, LOCAL_REGION, Resolver, TemplateError, deployment_order

PHYSICAL = {"Queue": "https://sqs/queue-1", "Table": "table-1"}
ATTRIBUTES = {("Queue", "Arn"): "arn:aws:sqs:us-east-1:123456789012:queue-1"}


def resolver(template: dict | None = None) -> Resolver:
    return Resolver(template or {}, PHYSICAL.__getitem__, lambda lid, att: ATTRIBUTES[(lid, att)])


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"Ref": "Queue"}, "https://sqs/queue-1"),
        ({"Ref": "AWS::Region"}, LOCAL_REGION),
        ({"Fn::GetAtt": ["Queue", "Arn"]}, "arn:aws:sqs:us-east-1:123456789012:queue-1"),
        ({"Fn::GetAtt": "Queue.Arn"}, "arn:aws:sqs:us-east-1:123456789012:queue-1"),
        ({"Fn::Join": ["-", ["a", {"Ref": "Table"}, "b"]]}, "a-table-1-b"),
        (
            {"Fn::Sub": "arn:aws:logs:${AWS::Region}:${AWS::AccountId}:x/${Table}"},
            f"arn:aws:logs:{LOCAL_REGION}:{LOCAL_ACCOUNT}:x/table-1",
        ),
        ({"Fn::Sub": ["${Name}-${Queue.Arn}", {"Name": "n"}]}, "n-arn:aws:sqs:us-east-1:123456789012:queue-1"),
        ({"Fn::Sub": "literal ${!NotAVariable}"}, "literal ${NotAVariable}"),
        ({"Fn::Select": [1, {"Fn::Split": [":", "a:b:c"]}]}, "b"),
        ({"Fn::Base64": "hi"}, "aGk="),
        ({"List": ["x", {"Ref": "AWS::NoValue"}]}, {"List": ["x"]}),
    ],
)
def test_intrinsics_resolve_to_the_local_values(value, expected):
    assert resolver().resolve(value) == expected


def test_conditions_choose_the_branch():
    template = {
        "Conditions": {
            "InUsEast1": {"Fn::Equals": [{"Ref": "AWS::Region"}, "us-east-1"]},
            "Not": {"Fn::Not": [{"Condition": "InUsEast1"}]},
        }
    }
    assert resolver(template).resolve({"Fn::If": ["InUsEast1", "yes", "no"]}) == "yes"
    assert resolver(template).resolve({"Fn::If": ["Not", "yes", "no"]}) == "no"


def test_an_unsupported_intrinsic_names_itself():
    with pytest.raises(TemplateError, match="Fn::ImportValue"):
        resolver().resolve({"Fn::ImportValue": "Other-Export"})


def test_resources_deploy_after_what_they_refer_to_and_depend_on():
    resources = {
        "Function": {"Type": "T", "Properties": {"Role": {"Fn::GetAtt": ["Role", "Arn"]}}, "DependsOn": "Policy"},
        "Policy": {"Type": "T", "Properties": {"Roles": [{"Ref": "Role"}]}},
        "Role": {"Type": "T", "Properties": {}},
        "Alarm": {"Type": "T", "Properties": {"Name": {"Fn::Sub": "${Function}-errors"}}},
    }
    order = deployment_order(resources)
    assert order.index("Role") < order.index("Policy") < order.index("Function") < order.index("Alarm")


def test_a_dependency_cycle_is_refused_with_its_path():
    resources = {
        "A": {"Type": "T", "Properties": {"X": {"Ref": "B"}}},
        "B": {"Type": "T", "Properties": {"X": {"Ref": "A"}}},
    }
    with pytest.raises(TemplateError, match="cycle: A -> B -> A"):
        deployment_order(resources)
