"""Issue 27's medium and low operational findings, on the synthesized template: Session Manager on the GPU
instances, the GPU AMI pinned by an option, fallback instance types of the same GPUs."""

from __future__ import annotations

import pytest
from aws_cdk import App

from app import props_from_context
from cdk.gpu_worker_service import SESSION_MANAGER_ACTIONS
from tests.cdk.helpers import role_statements


def _instance_role_id(synthesized) -> str:
    return synthesized.logical_id(synthesized.stack.service.fleets[0].workers.instance_role)


def test_gpu_instances_can_open_session_manager_sessions_and_nothing_more_of_ssm(synthesized):
    """GIVEN the GPU instances' role WHEN reading its SSM statements THEN the SSM Agent may register the instance and
    open Session Manager channels (a shell without an inbound port), and no other SSM action (no parameters,
    documents or commands: AmazonSSMManagedInstanceCore's wider set)."""
    statements = role_statements(synthesized.template, _instance_role_id(synthesized))
    ssm = {
        action
        for statement in statements
        for action in ([statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"])
        if action.startswith(("ssm:", "ssmmessages:", "ec2messages:"))
    }
    assert ssm == set(SESSION_MANAGER_ACTIONS)
    assert {"ssm:UpdateInstanceInformation", "ssmmessages:OpenDataChannel"} <= ssm
    managed = synthesized.json["Resources"][_instance_role_id(synthesized)]["Properties"].get("ManagedPolicyArns", [])
    assert "AmazonSSMManagedInstanceCore" not in str(managed)


PINNED_AMI = "ami-0123456789abcdef0"


def _image_id(synthesized):
    [launch] = synthesized.resources("AWS::EC2::LaunchTemplate").values()
    return launch["Properties"]["LaunchTemplateData"]["ImageId"]


def test_by_default_the_ami_floats_with_ecs_public_parameter(synthesized):
    """GIVEN no AMI option WHEN reading the launch template THEN its image is ECS's GPU AMI parameter, read at each
    deploy (what docs/deploying.md's AMI refresh is about)."""
    image = _image_id(synthesized)
    parameter = synthesized.json["Parameters"][image["Ref"]]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert "gpu" in parameter["Default"] and "amazon-linux-2023" in parameter["Default"]


def test_gpu_ami_id_pins_the_launch_templates_image(synth_variant):
    """GIVEN gpu_ami_id WHEN synthesized THEN the launch template names that AMI itself: no deploy changes it until
    the option does."""
    assert _image_id(synth_variant(gpu_ami_id=PINNED_AMI)) == PINNED_AMI


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpu_ami_id": "ubuntu-22"}, "is not an AMI id"),
        ({"gpu_ami_id": PINNED_AMI, "gpu_ami_parameter_name": "/x/ami"}, "conflicts with gpu_ami_parameter_name"),
    ],
)
def test_an_ami_option_that_cannot_hold_is_refused_naming_it(options, says):
    """GIVEN an AMI id that is not one, or both AMI options WHEN the app reads them THEN a ValueError names it."""
    with pytest.raises(ValueError, match="gpu_ami_id") as raised:
        props_from_context(App(context=options))
    assert says in str(raised.value)


FALLBACKS = ["g5.2xlarge", "g5.4xlarge"]


def test_fallback_types_launch_in_order_when_the_first_has_no_capacity(synth_variant):
    """GIVEN gpu_fallback_instance_types (same A10G) and no warm pool WHEN synthesized THEN the GPU group's mixed
    instances policy lists the first type then the fallbacks, on-demand only, prioritized in that order, and the
    capacity provider still drives the group."""
    variant = synth_variant(gpu_fallback_instance_types=FALLBACKS, gpu_warm_pool_instances=0)
    [group] = variant.resources("AWS::AutoScaling::AutoScalingGroup").values()
    policy = group["Properties"]["MixedInstancesPolicy"]
    types = [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]]
    assert types == ["g5.xlarge", *FALLBACKS]
    assert policy["InstancesDistribution"]["OnDemandAllocationStrategy"] == "prioritized"
    assert policy["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 100
    assert "LaunchTemplate" not in group["Properties"]
    [provider] = variant.resources("AWS::ECS::CapacityProvider").values()
    group_id = variant.logical_id(variant.stack.service.fleets[0].workers.auto_scaling_group)
    assert provider["Properties"]["AutoScalingGroupProvider"]["AutoScalingGroupArn"] == {"Ref": group_id}


def test_without_fallbacks_the_group_launches_its_one_type_from_the_template(synthesized):
    [group] = synthesized.resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert "MixedInstancesPolicy" not in group["Properties"] and "LaunchTemplate" in group["Properties"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"gpu_fallback_instance_types": ["g6.xlarge"], "gpu_warm_pool_instances": 0}, "whose GPUs are not"),
        ({"gpu_fallback_instance_types": ["g5.2xlarge"]}, "conflicts with a warm pool of 1"),
        ({"gpu_fallback_instance_types": ["g5.xlarge"], "gpu_warm_pool_instances": 0}, "without gpu_instance_type"),
    ],
)
def test_fallback_types_that_cannot_hold_are_refused_naming_the_option(options, says):
    """GIVEN a fallback of other GPUs, a warm pool beside fallbacks (PutWarmPool refuses a mixed instances policy),
    or the first type again WHEN the app reads them THEN a ValueError names gpu_fallback_instance_types and why."""
    with pytest.raises(ValueError, match="gpu_fallback_instance_types") as raised:
        props_from_context(App(context=options))
    assert says in str(raised.value)
