"""The warm pool's pre-initialization, on the synthesized template (Template.from_stack): no ReuseOnScaleIn (the ECS
guide forbids it for a group used by ECS), a launch lifecycle hook that holds a pool instance until its user data pulled
the worker image and fetched the weights, the ECS agent kept out of the cluster while the instance is in the pool, and
the instance role's rights for exactly that."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk.assertions import Match

from cdk.gpu_capacity import PER_BOOT_SCRIPT, POOL_INIT_HOOK_NAME
from cdk.gpu_worker_service import MODEL_CACHE_HOST_PATH
from tests.cdk.helpers import role_statements


def _user_data(synthesized) -> str:
    """The launch template's user data as text, each CloudFormation expression in it written as its JSON."""
    [launch] = synthesized.resources("AWS::EC2::LaunchTemplate").values()
    rendered = launch["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    parts = rendered["Fn::Join"][1] if isinstance(rendered, dict) else [rendered]
    return "".join(p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in parts)


def _instance_role_id(synthesized) -> str:
    return synthesized.stack.get_logical_id(
        synthesized.stack.service.fleets[0].workers.instance_role.node.default_child
    )


def _statements(synthesized, action: str) -> list[dict[str, Any]]:
    return [
        s
        for s in role_statements(synthesized.template, _instance_role_id(synthesized))
        if action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    ]


def test_warm_pool_does_not_set_reuse_on_scale_in(synthesized):
    """GIVEN the GPU group's warm pool WHEN synthesized THEN it sets no InstanceReusePolicy: the ECS guide says it
    cannot be set for a group used by ECS (awsdocs/amazon-ecs-developer-guide#216: it breaks the capacity provider's
    scale-in)."""
    synthesized.template.has_resource_properties(
        "AWS::AutoScaling::WarmPool", {"PoolState": "Stopped", "InstanceReusePolicy": Match.absent()}
    )


def test_launch_hook_holds_pool_instances_until_completed(synthesized):
    """GIVEN the GPU group WHEN synthesized THEN a launch lifecycle hook with the name the instance script completes
    holds new instances (CONTINUE after 20 minutes if nothing completes it), and the warm pool, whose instances launch
    once it exists, is created after the hook and the role's rights to complete it."""
    group_id = synthesized.logical_id(synthesized.stack.service.fleets[0].workers.auto_scaling_group)
    synthesized.template.has_resource_properties(
        "AWS::AutoScaling::LifecycleHook",
        {
            "AutoScalingGroupName": {"Ref": group_id},
            "LifecycleHookName": POOL_INIT_HOOK_NAME,
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
            "DefaultResult": "CONTINUE",
            "HeartbeatTimeout": 1200,
        },
    )
    capacity = synthesized.stack.service.fleets[0].capacity
    [pool] = synthesized.resources("AWS::AutoScaling::WarmPool").values()
    assert set(pool["DependsOn"]) >= {
        synthesized.stack.get_logical_id(capacity.pool_init_hook.node.default_child),
        synthesized.stack.get_logical_id(capacity.pool_init_policy.node.default_child),
    }


def test_user_data_pulls_the_image_and_fetches_the_weights_before_completing(synthesized):
    """GIVEN the launch template's user data WHEN read THEN it keeps the ECS agent out of the cluster while in the pool
    (ECS_WARM_POOLS_CHECK), and installs and runs a per-boot script that, for a pool target only, logs in to ECR with
    the instance role, pulls the task definition's image, fetches the Hugging Face weights into the image's HF_HOME on
    the task's host volume, and always completes the hook (on exit, so a failed pull never leaves it waiting)."""
    text = _user_data(synthesized)
    assert "echo ECS_WARM_POOLS_CHECK=true >> /etc/ecs/ecs.config" in text
    assert f"cat > {PER_BOOT_SCRIPT} <<'POOL_INIT'" in text
    assert f"\n{PER_BOOT_SCRIPT}" in text  # run now too: per-boot scripts ran before user data on the first boot
    script = text.split("<<'POOL_INIT'\n", 1)[1].split("\nPOOL_INIT\n", 1)[0]
    image = synthesized.container()["Image"]
    assert f"IMAGE='{json.dumps(image, sort_keys=True)}'" in script or f"IMAGE='{image}'" in script
    assert f"HOOK='{POOL_INIT_HOOK_NAME}'" in script
    assert "autoscaling/target-lifecycle-state" in script
    lines = script.splitlines()
    gate = lines.index('[[ "$STATE" == Warmed:* ]] || exit 0  # a start into service: nothing to fetch')
    trap = lines.index("trap complete_action EXIT")
    login = next(i for i, line in enumerate(lines) if "aws ecr get-login-password" in line and "docker login" in line)
    pull = lines.index('docker pull "$IMAGE"')
    fetch = next(i for i, line in enumerate(lines) if "snapshot_download" in line)
    assert trap < gate < login < pull < fetch
    assert "--lifecycle-action-result CONTINUE" in script and "complete-lifecycle-action" in script
    model = synthesized.worker_environment()["MODEL"]
    assert f'snapshot_download("{model}"' in lines[fetch]
    assert f"-v {MODEL_CACHE_HOST_PATH}:/models" in lines[fetch]


def test_instance_role_may_complete_the_hook_of_this_group_only(synthesized):
    """GIVEN the instance role WHEN its statements are read THEN CompleteLifecycleAction is allowed on this one group
    (by its name) and nothing else, DescribeAutoScalingInstances (no resource-level permission) on *, and the image
    pull (which the agent makes with the execution role) on the worker image's repository only."""
    group_id = synthesized.logical_id(synthesized.stack.service.fleets[0].workers.auto_scaling_group)
    [complete] = _statements(synthesized, "autoscaling:CompleteLifecycleAction")
    assert complete["Action"] == "autoscaling:CompleteLifecycleAction"
    [resource] = [complete["Resource"]] if not isinstance(complete["Resource"], list) else complete["Resource"]
    rendered = json.dumps(resource)
    assert f'"Ref": "{group_id}"' in rendered and "autoScalingGroupName/" in rendered
    [describe] = _statements(synthesized, "autoscaling:DescribeAutoScalingInstances")
    assert describe["Action"] == "autoscaling:DescribeAutoScalingInstances" and describe["Resource"] == "*"
    assert _statements(synthesized, "ecr:GetAuthorizationToken")
    repository = synthesized.container()["Image"]["Fn::Sub"].split("/", 1)[1].split(":", 1)[0]
    for action in ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"):
        [pull] = _statements(synthesized, action)
        assert pull["Resource"] != "*" and repository in json.dumps(pull["Resource"]), pull


def test_s3_weights_are_synced_with_the_workers_own_code_and_readable_by_the_instance(synth_variant):
    """GIVEN model_source s3 WHEN synthesized THEN the pool script syncs the model's prefix into the worker's MODEL_DIR
    with gpu_worker.model_source (whose manifest the worker trusts, so it keeps the files), and the instance role may
    read that prefix."""
    variant = synth_variant(model_source="s3")
    text = _user_data(variant)
    [fetch] = [line for line in text.splitlines() if "gpu_worker.model_source import ModelSource" in line]
    assert "snapshot_download" not in text
    assert "/models/s3/" in fetch and "ModelSource(" in fetch and ".sync()" in fetch
    [get] = _statements(variant, "s3:GetObject")
    assert f"/{variant.worker_environment()['MODEL'].strip('/')}/*" in json.dumps(get["Resource"])
    assert _statements(variant, "s3:ListBucket")
