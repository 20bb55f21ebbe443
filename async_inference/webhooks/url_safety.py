"""Which webhook URLs may be called: the URL's form, and every address its host resolves to (SSRF checks)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

MAX_URL_CHARS = 2048  # the same bound as schemas.WebhookSpec.url

# Where cloud providers serve instance metadata and credentials: named in refusals so the reason is plain.
_METADATA = {
    ipaddress.ip_address("169.254.169.254"),  # EC2/ECS/most clouds (IPv4)
    ipaddress.ip_address("169.254.170.2"),  # ECS task credentials
    ipaddress.ip_address("fd00:ec2::254"),  # EC2 (IPv6)
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Deprecated site-local IPv6 (RFC 3879): Python counts it global (ip.is_global is True), yet networks that still route
# it keep it inside their site, like a private range.
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")


class UnsafeUrl(ValueError):
    """A webhook URL that must not be called; the message says why, for a 400 or an attempt record."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL and the addresses it resolved to; delivery connects to these and nothing else."""

    url: str
    scheme: Literal["http", "https"]
    host: str
    port: int
    path: str  # path and query, as sent on the request line
    addresses: tuple[str, ...]

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (A and AAAA); UnsafeUrl when it resolves to none."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnsafeUrl(f"the host {host!r} does not resolve") from exc
    return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64): those reach the IPv4 host."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal(address: str, *, allow_local: bool = False) -> str | None:
    """Why a webhook may not be sent to ``address``, or None when it may."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _embedded_ipv4(ip) or ip
    if ip in _METADATA:
        return f"{address} is a cloud metadata address"
    if ip.is_loopback:
        return None if allow_local else f"{address} is a loopback address"
    if ip.is_link_local:
        return f"{address} is a link-local address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return f"{address} is not a unicast address"
    if ip.is_private or (isinstance(ip, ipaddress.IPv6Address) and ip in _SITE_LOCAL):
        return f"{address} is a private address"
    if not ip.is_global:
        return f"{address} is not a public address"
    return None


def check_url(url: str, *, allow_local: bool = False, resolver: Resolver = resolve) -> Target:
    """The URL as a delivery target, after resolving its host and checking every address; UnsafeUrl otherwise.

    Called at submit time and again before every delivery: a host that resolved to a public address when the job
    was submitted may resolve to 169.254.169.254 an hour later (DNS rebinding). Delivery then connects to the
    addresses checked here, so no second lookup happens between the check and the connection.
    """
    if len(url) > MAX_URL_CHARS:
        raise UnsafeUrl(f"the URL is longer than {MAX_URL_CHARS} characters")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise UnsafeUrl("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"the URL is not valid: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or (scheme == "http" and not allow_local):
        raise UnsafeUrl("the URL must start with https://")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("the URL must not contain credentials (user:password@)")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UnsafeUrl("the URL has no host")
    port = port or (443 if scheme == "https" else 80)
    addresses = resolver(host, port)
    if not addresses:
        raise UnsafeUrl(f"the host {host!r} does not resolve")
    for address in addresses:
        reason = refusal(address, allow_local=allow_local)
        if reason:
            raise UnsafeUrl(f"the host {host!r} resolves to a refused address: {reason}")
    if scheme == "http" and not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise UnsafeUrl("the URL must start with https:// (http is allowed for 127.0.0.1 only, and only locally)")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(url=url, scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))  # type: ignore[arg-type]
