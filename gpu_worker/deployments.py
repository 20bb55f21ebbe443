"""Whether a newer deployment of this task's ECS service is waiting for it to stop (issue #21, defect 4).

The service deploys stop-before-start by default, and ECS does not stop a protected task for a deployment: a worker
that kept renewing its protection under a steady stream of long jobs would hold a deployment (and ``cdk deploy``) for
as long as the load lasts. So a worker that learns of a newer deployment stops renewing its protection and clears it,
and stops taking long jobs (``gpu_worker.task_protection.Policy``); ECS then stops it like any unprotected task, with
SIGTERM and the drain, and its replacement runs the new task definition.

How it learns: the task's own metadata (``$ECS_CONTAINER_METADATA_URI_V4/task``, which ECS's agent serves to every
container: ``Cluster``, ``ServiceName``, ``Family``, ``Revision``) says which service and task definition it runs;
``DescribeServices`` says which task definition the service wants now (its ``taskDefinition``, the primary
deployment's). A service that wants another revision has a newer deployment waiting. The task role needs
``ecs:DescribeServices`` on its service. Looked at once every ``interval_s`` (one request a minute per task by
default); outside ECS (no metadata endpoint) nothing is asked, and no deployment is ever waiting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("gpu_worker.deployments")
DEFAULT_INTERVAL_S = 60.0


def task_metadata(metadata_uri: str) -> dict[str, Any]:
    """The task's metadata from the ECS agent (task metadata endpoint v4)."""
    with urllib.request.urlopen(f"{metadata_uri}/task", timeout=5) as response:
        return json.loads(response.read())


class DeploymentWatch:
    """Says whether a newer deployment of this task's service waits (``newer_waiting``), asking every ``interval_s``."""

    def __init__(
        self,
        metadata_uri: str | None,
        *,
        ecs: Any | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        metadata: Callable[[str], dict[str, Any]] = task_metadata,
    ) -> None:
        """``metadata_uri``: ``ECS_CONTAINER_METADATA_URI_V4`` (None outside ECS: never waiting); ``ecs``: an ECS
        client (made on first use)."""
        self._uri = metadata_uri
        self._ecs = ecs
        self.interval_s = interval_s
        self._metadata = metadata
        self._own: tuple[str, str, str] | None = None  # cluster, service, family:revision
        self._checked = -float("inf")  # time.monotonic() of the last look
        self.newer_waiting = False  # once seen, stays: a deployment does not un-happen for this task

    @property
    def enabled(self) -> bool:
        return self._uri is not None

    async def check(self) -> bool:
        """Look again if ``interval_s`` has passed since the last look; whether a newer deployment waits."""
        if self._uri is None or self.newer_waiting or time.monotonic() - self._checked < self.interval_s:
            return self.newer_waiting
        self._checked = time.monotonic()
        try:
            self.newer_waiting = await asyncio.to_thread(self._look)
        except Exception as exc:  # not knowing keeps today's behaviour: protection as the jobs call for it
            logger.warning("could not tell whether a newer deployment waits: %s", exc)
        if self.newer_waiting:
            logger.warning("a newer deployment of this service waits: clearing task protection, taking no long jobs")
        return self.newer_waiting

    def _look(self) -> bool:
        if self._own is None:
            task = self._metadata(self._uri or "")
            if not task.get("ServiceName"):
                logger.info("this task belongs to no service: no deployment can wait for it")
                self._uri = None
                return False
            self._own = (task["Cluster"], task["ServiceName"], f"{task['Family']}:{task['Revision']}")
        cluster, service, own = self._own
        if self._ecs is None:
            from async_inference.aws import client

            self._ecs = client("ecs")
        found = self._ecs.describe_services(cluster=cluster, services=[service]).get("services", [])
        if not found:
            return False
        wanted = str(found[0].get("taskDefinition", "")).rsplit("/", 1)[-1]  # an ARN ends in family:revision
        return bool(wanted) and wanted != own
