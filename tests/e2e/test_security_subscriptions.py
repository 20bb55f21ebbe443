"""Result-topic subscriptions can be limited to a tenant: every notification carries the ``tenant`` message
attribute, and a subscription filtering on it receives that tenant's notifications only (moto's SNS applies the
filter policy as SNS does)."""

from __future__ import annotations

import pytest

from async_inference_client import Client
from local_runtime.stack import LocalDeployment
from tests.e2e.conftest import Subscriber, chat

pytestmark = pytest.mark.e2e


def test_a_subscription_filtered_on_a_tenant_gets_that_tenants_notifications_only(
    stack: LocalDeployment, api: Client, other_api: Client
):
    # GIVEN a queue subscribed to the result topic for tenant-b only, and a queue subscribed for everyone
    tenant_b_only = Subscriber(stack, filter_policy={"tenant": ["tenant-b"]})
    everyone = Subscriber(stack)
    # WHEN a job of each tenant ends (cancelled: no worker runs here)
    mine = api.cancel(api.submit(chat("a's job")).job_id)
    theirs = other_api.cancel(other_api.submit(chat("b's job")).job_id)
    # THEN both notifications carry their tenant
    assert [n["status"] for n in everyone.for_job(mine.job_id)] == ["cancelled"]
    assert [n["status"] for n in everyone.for_job(theirs.job_id)] == ["cancelled"]
    assert [a["tenant"] for a in everyone.attributes[mine.job_id] + everyone.attributes[theirs.job_id]] == [
        "tenant-a",
        "tenant-b",
    ]
    # AND the filtered subscription got tenant-b's only
    assert [n["status"] for n in tenant_b_only.for_job(theirs.job_id)] == ["cancelled"]
    assert tenant_b_only.for_job(mine.job_id) == []
