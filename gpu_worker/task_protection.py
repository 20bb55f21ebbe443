"""ECS task scale-in protection: the agent's endpoint (``TaskProtection``) and when the worker holds it (``Policy``).

A protected task is stopped by neither scale-in nor a deployment. What protection costs is the step-down: a task that
is never unprotected while busy is never removed while the fleet is busy. So the worker holds it as its
``TASK_PROTECTION`` mode says (``async_inference.config.TASK_PROTECTION_MODES``; the task definition sets it):

* ``long_jobs``: while it runs a job that could outlast its SIGTERM drain (``outlasts_drain``: max_tokens at the
  expected decode rate beyond ``drain_timeout_s``). A task stopped while running only shorter jobs lets them finish
  within the drain, or hands them back at its end, so little work is lost;
* ``busy``: whenever it holds a job;
* ``off``: never.

When nothing calls for it any more the protection is cleared, so the service can scale in. Once a newer deployment
of the service waits for this task (``gpu_worker.deployments``), nothing calls for it: the worker clears it, renews it
no more, and leaves long jobs (those that could outlast the drain) to the new deployment's tasks, so that ECS stops
this task and the deployment finishes. Protection expires by
itself (``EXPIRES_IN_MINUTES``), so a worker that holds it renews it well before then (``set(True, renew_after_s=...)``
at its heartbeat). Outside ECS (no ``ECS_AGENT_URI``) this does nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpu_worker.deployments import DeploymentWatch

logger = logging.getLogger("gpu_worker.task_protection")

# Protection lapses by itself after this long, so a worker that hangs does not pin the fleet up forever; a busy worker
# renews it every DEFAULT_RENEW_S, which leaves three renewals' slack for a failed PUT or a slow heartbeat.
EXPIRES_IN_MINUTES = 60
DEFAULT_RENEW_S = 15 * 60


class TaskProtection:
    def __init__(self, agent_uri: str | None) -> None:
        """``agent_uri``: ``ECS_AGENT_URI``; None outside ECS, where ``set`` does nothing."""
        self._url = f"{agent_uri}/task-protection/v1/state" if agent_uri else None
        self._enabled = False  # a task starts unprotected, so clearing before any enable asks nothing
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
        body: dict[str, bool | int] = {"ProtectionEnabled": enabled}
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


def outlasts_drain(max_tokens: int, *, tokens_per_s: float, drain_timeout_s: float) -> bool:
    """Whether a job that may generate ``max_tokens`` at ``tokens_per_s`` could still be running when a drain of
    ``drain_timeout_s`` ends (its prompt's prefill is a fraction of a second and not counted)."""
    return max_tokens / tokens_per_s > drain_timeout_s


class Held(Protocol):
    """What the policy reads of a message the worker holds (``gpu_worker.claims.InFlight``)."""

    protect: bool  # its job could outlast the drain


class Policy:
    """When this worker holds its task protection, in its ``TASK_PROTECTION`` mode (this module's docstring).

    Every change is decided and made under one lock, so that an enable and a clear racing each other (receivers,
    finishing jobs, the heartbeat's renewal) end as the messages held at the end require."""

    def __init__(
        self,
        protection: TaskProtection,
        *,
        mode: str,
        tokens_per_s: float,
        drain_timeout_s: float,
        renew_s: float,
        held: Callable[[], Iterable[Held]],
        deployments: DeploymentWatch | None = None,
    ) -> None:
        self.protection = protection
        self.deployments = deployments
        self.mode = mode
        self.tokens_per_s = tokens_per_s
        self.drain_timeout_s = drain_timeout_s
        self.renew_s = renew_s
        self._held = held
        self._lock = asyncio.Lock()

    def is_long(self, max_tokens: int) -> bool:
        """Whether a job of ``max_tokens`` calls for protection (``long_jobs`` mode only)."""
        return self.mode == "long_jobs" and outlasts_drain(
            max_tokens, tokens_per_s=self.tokens_per_s, drain_timeout_s=self.drain_timeout_s
        )

    @property
    def newer_deployment(self) -> bool:
        """Whether a newer deployment of the service waits for this task to stop."""
        return self.deployments is not None and self.deployments.newer_waiting

    def refuses(self, max_tokens: int) -> bool:
        """Whether to leave a job of ``max_tokens`` to the newer deployment's tasks: one that could outlast the drain,
        once a newer deployment waits."""
        return self.newer_deployment and outlasts_drain(
            max_tokens, tokens_per_s=self.tokens_per_s, drain_timeout_s=self.drain_timeout_s
        )

    async def watch(self) -> None:
        """Look for a newer deployment (at the watch's own pace); clear the protection once one waits."""
        if self.deployments is None or self.deployments.newer_waiting:
            return
        if await self.deployments.check():
            await self.sync()

    def wants(self) -> bool:
        """Whether the messages held now call for protection."""
        if self.newer_deployment:
            return False
        if self.mode == "busy":
            return any(True for _ in self._held())
        if self.mode == "long_jobs":
            return any(held.protect for held in self._held())
        return False

    async def received(self, count: int, *, held_before: int) -> None:
        """Messages arrived: a ``busy`` worker that held none protects itself before it starts them."""
        if count and not held_before and self.mode == "busy":
            async with self._lock:
                await self.protection.set(True)

    async def sync(self) -> None:
        """Hold protection exactly while ``wants``."""
        async with self._lock:
            await self.protection.set(self.wants())

    async def renew(self) -> None:
        """Keep a held protection from expiring (and retry an enable that failed); a worker whose protected jobs ended
        meanwhile is not protected again after its clear."""
        async with self._lock:
            if self.wants():
                await self.protection.set(True, renew_after_s=self.renew_s)

    async def clear(self) -> None:
        async with self._lock:
            await self.protection.set(False)
