"""The simulator's counterfactual rows: the synthesized template less one of the stack's choices (its warm pool, its
instance release, its learned keep-alive's function, the wake's instance start, the hold's maximum, the pool's
pre-initialization), so that each choice is measured by what the stack does without it.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from async_inference.keep_alive import ENV_KEEP_ALIVE_POLICY


def _drop_worker_groups(parts: list[Any]) -> None:
    """MODEL_FLEETS' joined parts without each route's ``worker_group`` (the last key of a route: ``,"worker_group":"``,
    the group's Ref, then ``"`` and what follows)."""
    key = ',"worker_group":"'
    for index in range(len(parts) - 2, 0, -1):
        before, after = parts[index - 1], parts[index + 1]
        if isinstance(before, str) and before.endswith(key) and isinstance(after, str) and after.startswith('"'):
            parts[index - 1], parts[index + 1] = before[: -len(key)], after[1:]
            del parts[index]


def without(template: dict[str, Any], choice: str) -> dict[str, Any]:
    """The template without its warm pool (and so without the hold's maximum, as the stack synthesizes it), its
    instance release, its learned keep-alive's function, the wake's instance start, the hold's maximum (the functions do not know the service's maximum,
    so a hold raises only the minimum), or the pool's pre-initialization (its launch lifecycle hook) (the simulator's
    counterfactual rows)."""
    result = copy.deepcopy(template)
    if choice in ("instance_start", "hold_cap"):
        for resource in result["Resources"].values():
            # Each model's route: its parameter of the deployment's catalog (async_inference.catalog).
            if resource["Type"] != "AWS::SSM::Parameter" or "/catalog/models/" not in str(resource["Properties"]):
                continue
            routes = resource["Properties"]["Value"]
            if not (isinstance(routes, dict) and "Fn::Join" in routes):
                continue
            parts = routes["Fn::Join"][1]
            if choice == "instance_start":
                _drop_worker_groups(parts)
            else:
                parts[:] = [
                    re.sub(r'"worker_(?:hold_)?max_tasks":\d+,', "", p) if isinstance(p, str) else p for p in parts
                ]
        return result
    if choice == "keep_alive":  # the learned keep-alive's function gone: its decision is never published
        result["Resources"] = {
            k: v
            for k, v in result["Resources"].items()
            if ENV_KEEP_ALIVE_POLICY not in str(v.get("Properties", {}).get("Environment", ""))
        }
        return result
    if choice == "pool_pre_initialized":
        result["Resources"] = {
            k: v for k, v in result["Resources"].items() if v["Type"] != "AWS::AutoScaling::LifecycleHook"
        }
        return result
    if choice == "warm_pool":  # as the stack synthesizes without a pool: the hold raises only the minimum
        result = without(result, "hold_cap")
    kind = "AWS::AutoScaling::WarmPool" if choice == "warm_pool" else "AWS::Events::Rule"
    result["Resources"] = {k: v for k, v in result["Resources"].items() if v["Type"] != kind}
    return result
