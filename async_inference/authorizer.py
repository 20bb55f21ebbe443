"""Who is calling: the API key a request carries, as ``Authorization: Bearer <key>`` (what the openai SDK sends) or
``x-api-key`` (this project's client, curl), mapped to its tenant. The API Gateway REQUEST authorizer
(``lambdas/authorizer``) runs this for every request.

API Gateway's own authorizer cache cannot be used here: with caching on, every identity source must be present in a
request or API Gateway answers 401 without calling the authorizer, and a request carries one header or the other. So
the gateway's TTL is 0 and the cache is this one: the tenants' key values, read from API Gateway in one ``GetApiKeys``
call (500 keys a page) whatever the number of tenants, of which only this stack's key ids count, and kept
``KEYS_TTL_S``; a value not among them re-reads the keys at most every ``REFRESH_MIN_S``
(a caller cannot make each request cost an API Gateway read).

Revocation bound: a key disabled or deleted in API Gateway stops authorizing, on the REST API and on WebSocket
``$connect`` alike (both use this class), at most ``KEYS_TTL_S`` seconds later in every execution environment.
A tenant may have several keys (``{"tenant": ["key id", ...]}``): rotation adds the new key, moves the clients over,
then disables the old one, with no moment when the tenant has none.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

BEARER = "bearer "
# The revocation bound (docs/security.md). Each refresh, per execution environment, is one GetApiKeys page of up to 500
# keys (a GetApiKey per key id made 200 reads a refresh for 100 tenants rotating keys, against API Gateway's
# control-plane total of 10 requests a second per account, "Amazon API Gateway quotas", managing an API).
KEYS_TTL_S = 30.0
REFRESH_MIN_S = 10.0

# Every API key the role may read: key id -> (value, enabled)
FetchKeys = Callable[[], Mapping[str, "tuple[str, bool]"]]


@dataclass(frozen=True)
class Caller:
    tenant: str
    api_key: str  # the usage plan's key: API Gateway throttles and counts the tenant's requests by it


def key_hash(value: str) -> str:
    """What a WebSocket connection records of the key it opened with: enough to tell whether that key is still
    valid, never the key itself (the connection table is readable by more roles than the keys are)."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]


KEY_HEADERS = ("authorization", "x-api-key")


def repeats_a_key_header(multi_value_headers: Mapping[str, Sequence[str] | None] | None) -> bool:
    """Whether a request sends ``Authorization`` or ``x-api-key`` more than once. API Gateway hands an authorizer the
    last value of a repeated header in ``headers`` (all of them in ``multiValueHeaders``): two x-api-key headers of
    two tenants would be served as the second one's, so such a request is refused, as a Bearer key with a different
    x-api-key is."""
    counts: dict[str, int] = {}
    for name, values in (multi_value_headers or {}).items():
        counts[name.lower()] = counts.get(name.lower(), 0) + len(values or ())
    return any(counts.get(name, 0) > 1 for name in KEY_HEADERS)


def presented_keys(headers: Mapping[str, str] | None) -> list[str]:
    """The API keys a request presents: its Bearer token and its x-api-key, each when present."""
    lowered = {k.lower(): v for k, v in (headers or {}).items() if isinstance(v, str)}
    keys = []
    authorization = lowered.get("authorization", "").strip()
    if authorization.lower().startswith(BEARER) and authorization[len(BEARER) :].strip():
        keys.append(authorization[len(BEARER) :].strip())
    if lowered.get("x-api-key", "").strip():
        keys.append(lowered["x-api-key"].strip())
    return keys


class TenantKeys:
    """API key value -> tenant, over this stack's tenants' keys (``key_ids``: tenant -> its key id, or its key ids)."""

    def __init__(
        self,
        key_ids: Mapping[str, str | Sequence[str]],
        fetch: FetchKeys,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl_s: float = KEYS_TTL_S,
        refresh_min_s: float = REFRESH_MIN_S,
    ) -> None:
        self._key_ids = {tenant: (ids,) if isinstance(ids, str) else tuple(ids) for tenant, ids in key_ids.items()}
        self._fetch = fetch
        self._clock = clock
        self._ttl_s = ttl_s
        self._refresh_min_s = refresh_min_s
        self._by_value: dict[str, str] = {}
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def tenant_of(self, value: str) -> str | None:
        with self._lock:
            now = self._clock()
            stale = self._read_at is None or now - self._read_at >= self._ttl_s
            unknown = value not in self._by_value and (
                self._read_at is None or now - self._read_at >= self._refresh_min_s
            )
            if stale or unknown:
                self._read(now)
            return self._by_value.get(value)

    def holds(self, tenant: str, hashed: str) -> bool:
        """Whether ``hashed`` (``key_hash``) is of a key the tenant still has, enabled (as of at most ``ttl_s`` ago)."""
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._ttl_s:
                self._read(now)
            return any(t == tenant and key_hash(value) == hashed for value, t in self._by_value.items())

    def _read(self, now: float) -> None:
        every_key = self._fetch()  # one call for all tenants' keys
        by_value = {}
        for tenant, ids in self._key_ids.items():
            for key_id in ids:
                found = every_key.get(key_id)  # a key of another API of the account never maps to a tenant
                if found is not None and found[1]:
                    by_value[found[0]] = tenant
        self._by_value, self._read_at = by_value, now

    def caller(
        self,
        headers: Mapping[str, str] | None,
        multi_value_headers: Mapping[str, Sequence[str] | None] | None = None,
    ) -> Caller | None:
        """The tenant of a request's key(s); None when it presents none, an unknown or disabled one, two keys of
        different tenants, or a key header more than once (``multi_value_headers``: API Gateway's, every value)."""
        if repeats_a_key_header(multi_value_headers):
            return None
        keys = presented_keys(headers)
        tenants = {self.tenant_of(key) for key in keys}
        if not keys or None in tenants or len(tenants) != 1:
            return None
        return Caller(tenant=tenants.pop(), api_key=keys[0])  # type: ignore[arg-type]
