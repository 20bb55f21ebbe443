"""The webhook SSRF filter refuses deprecated site-local IPv6 (fec0::/10), which Python counts as global."""

from __future__ import annotations

import ipaddress

import pytest

from async_inference.webhooks.url_safety import UnsafeUrl, check_url, refusal


@pytest.mark.parametrize("address", ["fec0::1", "fec0::a:1", "feff:ffff::1", "::ffff:10.0.0.1"])
def test_site_local_and_other_inside_addresses_are_refused(address):
    # GIVEN an address inside a site WHEN checked as a webhook target THEN it is refused as private
    assert refusal(address) == f"{address} is a private address"


def test_a_host_resolving_to_a_site_local_address_is_refused():
    # GIVEN a host that resolves to fec0::1, which Python's ipaddress counts as global
    assert ipaddress.ip_address("fec0::1").is_global
    # WHEN its URL is checked THEN it is refused, naming the address
    with pytest.raises(UnsafeUrl, match="fec0::1 is a private address"):
        check_url("https://hooks.example.com/x", resolver=lambda host, port: ["fec0::1"])


def test_a_public_ipv6_address_is_still_allowed():
    # GIVEN a public IPv6 address WHEN checked THEN it passes (the new rule refuses fec0::/10 only)
    assert refusal("2606:4700:4700::1111") is None
