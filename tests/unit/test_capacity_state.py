"""GET /v1/models says why a model's jobs stay queued (issue 27, finding 3): its GPU group's latest launch failed."""

from __future__ import annotations

import datetime as dt
from typing import Any

from async_inference.capacity_state import CapacityState
from async_inference.fleets import FleetRoute
from async_inference_client.models.batches import Model, ModelList

QUOTA = (
    "Launching a new EC2 instance. Status Reason: You have requested more vCPU capacity than your current vCPU limit "
    "of 0 allows for the instance bucket that the specified instance type belongs to."
)
STARTED = dt.datetime(2026, 12, 7, 5, 0, tzinfo=dt.UTC)


class _AutoScaling:
    def __init__(self, activities: dict[str, list[dict[str, Any]]]) -> None:
        self.activities = activities
        self.calls = 0

    def describe_scaling_activities(self, AutoScalingGroupName: str, MaxRecords: int) -> dict[str, Any]:
        self.calls += 1
        return {"Activities": self.activities.get(AutoScalingGroupName, [])[:MaxRecords]}


def _failed(message: str = QUOTA) -> dict[str, Any]:
    return {"StatusCode": "Failed", "StatusMessage": message, "StartTime": STARTED}


def _models(*names: str) -> ModelList:
    return ModelList(data=[Model(id=name, created=1, owned_by="system") for name in names])


def test_a_model_whose_latest_launch_failed_says_why_with_ec2s_reason():
    # GIVEN two models, the first's group failing its launches on a quota of 0, the second's launched
    state = CapacityState(
        {"chat": "gpu-chat", "embed": "gpu-embed"},
        _AutoScaling({"gpu-chat": [_failed()], "gpu-embed": [{"StatusCode": "Successful"}]}),
    )
    # WHEN the models are listed
    listed = state.annotate_list(_models("chat", "embed"))
    # THEN the first carries the failure and EC2's message, the second nothing
    chat, embed = listed.data
    assert chat.capacity is not None and chat.capacity.state == "launch_failed"
    assert chat.capacity.reason == QUOTA and chat.capacity.since == int(STARTED.timestamp())
    assert embed.capacity is None


def test_a_group_with_no_activity_or_one_under_way_reports_nothing():
    state = CapacityState({"a": "g-a", "b": "g-b"}, _AutoScaling({"g-b": [{"StatusCode": "InProgress"}]}))
    assert [m.capacity for m in state.annotate_list(_models("a", "b")).data] == [None, None]


def test_listings_within_the_ttl_read_each_group_once():
    # GIVEN a clock WHEN the models are listed twice within the TTL and once after THEN two reads, not three
    now = [0.0]
    autoscaling = _AutoScaling({"g": [_failed()]})
    state = CapacityState({"m": "g"}, autoscaling, ttl_s=60, clock=lambda: now[0])
    state.annotate_list(_models("m"))
    now[0] = 59
    state.annotate_list(_models("m"))
    now[0] = 61
    state.annotate_list(_models("m"))
    assert autoscaling.calls == 2


def test_a_read_that_fails_lists_the_model_without_capacity():
    class Refusing:
        def describe_scaling_activities(self, **_: Any) -> dict[str, Any]:
            raise RuntimeError("AccessDenied")

    [model] = CapacityState({"m": "g"}, Refusing()).annotate_list(_models("m")).data
    assert model.capacity is None


def test_the_groups_come_from_the_routes_the_stack_sets():
    # GIVEN MODEL_FLEETS with a group for one model and none for another (no wake from zero for it)
    routes = {
        "chat": FleetRoute(queue_url="q1", worker_group="gpu-chat"),
        "other": FleetRoute(queue_url="q2"),
    }
    # THEN only the routed group is read
    assert CapacityState.from_routes(routes, _AutoScaling({})).groups == {"chat": "gpu-chat"}
