"""ECS task scale-in protection, through the ECS agent's endpoint.

While a task holds jobs it is protected, so neither scale-in nor a deployment stops it mid-generation; when it is idle
the protection is cleared so the service can scale to zero. Outside ECS (no ``ECS_AGENT_URI``) this does nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request

logger = logging.getLogger("gpu_worker.task_protection")

# Protection lapses by itself after this long, so a worker that hangs does not pin the fleet up forever; the worker
# renews it at every change of state, and holds a job at most the execution timeout.
EXPIRES_IN_MINUTES = 60


class TaskProtection:
    def __init__(self, agent_uri: str | None) -> None:
        """``agent_uri``: ``ECS_AGENT_URI``; None outside ECS, where ``set`` does nothing."""
        self._url = f"{agent_uri}/task-protection/v1/state" if agent_uri else None
        self._enabled: bool | None = None

    async def set(self, enabled: bool) -> None:
        if self._url is None or self._enabled == enabled:
            return
        body = {"ProtectionEnabled": enabled}
        if enabled:
            body["ExpiresInMinutes"] = EXPIRES_IN_MINUTES
        request = urllib.request.Request(
            self._url, data=json.dumps(body).encode(), method="PUT", headers={"Content-Type": "application/json"}
        )
        try:
            await asyncio.to_thread(lambda: urllib.request.urlopen(request, timeout=5).read())
            self._enabled = enabled
        except OSError as exc:
            # Losing protection risks a scale-in mid-job, which redelivery recovers from: log, do not crash.
            logger.warning("could not set task protection to %s: %s", enabled, exc)
