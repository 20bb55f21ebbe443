"""Revocation within a bound of seconds, and overlapping rotation: the key lookup both APIs use
(async_inference.authorizer.TenantKeys, the REST authorizer and WebSocket $connect)."""

from __future__ import annotations

from async_inference.authorizer import KEYS_TTL_S, TenantKeys


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Keys(dict):
    """API Gateway's GetApiKeys: every key, key id -> (value, enabled)."""

    def __call__(self):
        return dict(self)


def test_a_disabled_key_stops_working_within_the_documented_bound_of_seconds():
    # GIVEN a warm lookup (defaults, as both functions build it) that has just accepted tenant a's key
    clock, keys = Clock(), Keys({"id-a": ("key-a", True)})
    tenants = TenantKeys({"a": "id-a"}, keys, clock=clock)
    assert tenants.tenant_of("key-a") == "a"
    # WHEN the key is disabled in API Gateway
    keys["id-a"] = ("key-a", False)
    # THEN it is refused at most 30 s later (the bound docs/security.md states), not after minutes
    clock.now = 30.0
    assert KEYS_TTL_S <= 30 and tenants.tenant_of("key-a") is None


def test_a_tenant_with_two_keys_is_served_on_either_and_keeps_the_new_one_when_the_old_is_disabled():
    # GIVEN a tenant rotating keys: its old and its new key both enabled
    clock, keys = Clock(), Keys({"id-old": ("old-key", True), "id-new": ("new-key", True), "id-b": ("b-key", True)})
    tenants = TenantKeys({"a": ["id-old", "id-new"], "b": "id-b"}, keys, clock=clock)
    # THEN either key is the tenant's
    assert tenants.tenant_of("old-key") == tenants.tenant_of("new-key") == "a" and tenants.tenant_of("b-key") == "b"
    # WHEN the old key is disabled, once the lookup refreshes
    keys["id-old"] = ("old-key", False)
    clock.now = KEYS_TTL_S
    # THEN the old key is refused and the new one still serves the tenant: no moment without a working key
    assert tenants.tenant_of("old-key") is None and tenants.tenant_of("new-key") == "a"
