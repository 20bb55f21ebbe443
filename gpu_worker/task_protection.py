"""ECS task scale-in protection, through the ECS agent's endpoint.

While a task holds jobs it is protected, so neither scale-in nor a deployment stops it mid-generation; when it is idle
the protection is cleared so the service can scale to zero. Protection expires by itself (``EXPIRES_IN_MINUTES``), so
a busy worker renews it well before then (``set(True, renew_after_s=...)`` at its heartbeat). Outside ECS (no
``ECS_AGENT_URI``) this does nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request

logger = logging.getLogger("gpu_worker.task_protection")

# Protection lapses by itself after this long, so a worker that hangs does not pin the fleet up forever; a busy worker
# renews it every DEFAULT_RENEW_S, which leaves three renewals' slack for a failed PUT or a slow heartbeat.
EXPIRES_IN_MINUTES = 60
DEFAULT_RENEW_S = 15 * 60


class TaskProtection:
    def __init__(self, agent_uri: str | None) -> None:
        """``agent_uri``: ``ECS_AGENT_URI``; None outside ECS, where ``set`` does nothing."""
        self._url = f"{agent_uri}/task-protection/v1/state" if agent_uri else None
        self._enabled: bool | None = None
        self._enabled_at = 0.0  # time.monotonic() of the last successful enable

    async def set(self, enabled: bool, *, renew_after_s: float | None = None) -> None:
        """Enable or clear the protection. A call that changes nothing makes no request, except that with
        ``renew_after_s`` an enabled protection set longer ago than that is set again, with a fresh expiry."""
        if self._url is None:
            return
        if self._enabled == enabled:
            stale = enabled and renew_after_s is not None and time.monotonic() - self._enabled_at >= renew_after_s
            if not stale:
                return
        await self._put(enabled)

    async def _put(self, enabled: bool) -> None:
        assert self._url is not None
        body = {"ProtectionEnabled": enabled}
        if enabled:
            body["ExpiresInMinutes"] = EXPIRES_IN_MINUTES
        request = urllib.request.Request(
            self._url, data=json.dumps(body).encode(), method="PUT", headers={"Content-Type": "application/json"}
        )
        try:
            await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=5).read())
            self._enabled = enabled
            if enabled:
                self._enabled_at = time.monotonic()
        except OSError as exc:
            # Losing protection risks a scale-in mid-job, which redelivery recovers from: log, do not crash.
            logger.warning("could not set task protection to %s: %s", enabled, exc)
