"""The worker as its task definition says, supervised as ECS supervises a service's tasks.

A worker process gets what its container would, and nothing from the environment of the process that starts it:

* the image's own configuration (the Dockerfile's ``ENV``, ``WORKDIR`` and ``ENTRYPOINT``/``CMD``, read from the
  image asset the template references), with container paths mapped to local directories;
* the container definition's ``Environment`` and ``Secrets`` (read from the local Secrets Manager when a worker
  starts, as ECS reads them when it starts a task), resolved;
* what ECS itself provides (``ECS_PROVIDED``): ``AWS_EXECUTION_ENV``; in AWS also credentials through
  ``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`` and the agent and metadata endpoints, which locally are static
  credentials and nothing (task protection is then a no-op);
* the local runtime's overrides (``local_runtime.stack``): the moto endpoint, the local engine and model.

The supervisor replaces a worker that exits or is killed, as ECS replaces a service's stopped task, and runs the
container's health check: after ``Retries`` failures in a row (once ``StartPeriod`` has passed) the worker is stopped
(SIGTERM, SIGKILL after the container's ``StopTimeout``) and replaced.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from async_inference.config import DEFAULT_HEALTH_FILE, ENV_HEALTH_FILE
from local_runtime.deployer import Deployment
from local_runtime.template import TemplateError

logger = logging.getLogger("local_runtime.workers")
ECS_PROVIDED = {"AWS_EXECUTION_ENV": "AWS_ECS_EC2"}
# Minimal process environment of a container (the image's base sets these).
CONTAINER_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
REPLACE_DELAY_S = 1.0  # ECS takes longer; locally a replacement comes at once
FIRST_SERVICE_NAME = "gpu-workers"  # cdk.gpu_worker_service.WORKER_ECS_SERVICE_NAME (the local runtime imports no CDK)


@dataclass(frozen=True)
class Image:
    """What the worker image's Dockerfile declares, read from the image asset."""

    directory: Path  # the build context as staged in the assembly
    environment: dict[str, str]
    workdir: str
    entrypoint: list[str]

    @classmethod
    def from_asset(cls, directory: Path, dockerfile: str) -> Image:
        environment: dict[str, str] = {}
        workdir, entrypoint, command = "/", [], []
        for instruction, argument in _instructions((directory / dockerfile).read_text()):
            if instruction == "ENV":
                environment.update(_env_pairs(argument))
            elif instruction == "WORKDIR":
                workdir = argument.strip()
            elif instruction == "ENTRYPOINT":
                entrypoint = _exec_form(argument)
            elif instruction == "CMD":
                command = _exec_form(argument)
            elif instruction == "FROM":
                environment, entrypoint, command = {}, [], []  # a new stage starts afresh
        return cls(directory=directory, environment=environment, workdir=workdir, entrypoint=entrypoint + command)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument) pairs of a Dockerfile, with line continuations joined and comments dropped."""
    joined, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        joined.append(current + stripped)
        current = ""
    pairs = []
    for line in joined:
        instruction, _, argument = line.partition(" ")
        pairs.append((instruction.upper(), argument.strip()))
    return pairs


def _env_pairs(argument: str) -> dict[str, str]:
    words = shlex.split(argument)
    if words and "=" not in words[0]:  # the legacy form: ENV NAME value
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words)


def _exec_form(argument: str) -> list[str]:
    return json.loads(argument) if argument.startswith("[") else ["/bin/sh", "-c", argument]


@dataclass(frozen=True)
class TaskDefinition:
    """The worker container of the template's task definition, resolved against the deployment."""

    image: Image
    environment: dict[str, str]
    secrets: dict[str, str]  # variable -> ValueFrom (a secret ARN, optionally :json-key:stage:version)
    stop_timeout_s: int
    health_check: dict[str, Any] | None
    mounts: dict[str, str]  # container path -> volume name
    command: list[str] = field(default_factory=list)

    @classmethod
    def from_deployment(cls, deployment: Deployment, logical_id: str | None = None) -> TaskDefinition:
        """The task definition ``logical_id`` (None: the template's only one)."""
        definitions = deployment.of_type("AWS::ECS::TaskDefinition")
        if logical_id is None and len(definitions) != 1:
            raise TemplateError(f"expected one task definition, the template has {len(definitions)}")
        definition = definitions[logical_id] if logical_id is not None else next(iter(definitions.values()))
        containers = definition.properties["ContainerDefinitions"]
        container = next((c for c in containers if c.get("Essential", True)), containers[0])
        image = Image.from_asset(*_image_asset(deployment, container["Image"]))
        return cls(
            image=image,
            environment={e["Name"]: str(e["Value"]) for e in container.get("Environment", [])},
            secrets={s["Name"]: s["ValueFrom"] for s in container.get("Secrets", [])},
            stop_timeout_s=int(container.get("StopTimeout", 30)),
            health_check=container.get("HealthCheck"),
            mounts={m["ContainerPath"]: m["SourceVolume"] for m in container.get("MountPoints", [])},
            command=list(container.get("EntryPoint", [])) + list(container.get("Command", [])),
        )

    def resolved_secrets(self, secretsmanager: Any) -> dict[str, str]:
        """Each secret's value as ECS injects it: the whole secret, or one JSON key of it (``arn:key::``)."""
        values = {}
        for name, value_from in self.secrets.items():
            arn, key = value_from, None
            parts = value_from.split(":")
            if len(parts) > 7:  # arn:aws:secretsmanager:region:account:secret:name-xyz:json-key:stage:version
                arn, key = ":".join(parts[:7]), parts[7] or None
            secret = secretsmanager.get_secret_value(SecretId=arn)["SecretString"]
            values[name] = json.loads(secret)[key] if key else secret
        return values


def service_task_definitions(deployment: Deployment) -> dict[str, TaskDefinition]:
    """Each ECS service's task definition, by the service's name (``ServiceName``; the logical id without one), the
    first model's service (``cdk.gpu_worker_service.WORKER_ECS_SERVICE_NAME``, the name without a suffix) first."""
    found = {}
    for logical_id, service in deployment.assembly.of_type("AWS::ECS::Service").items():
        properties = service.get("Properties", {})
        definition = properties.get("TaskDefinition")
        if not (isinstance(definition, dict) and "Ref" in definition):
            raise TemplateError(f"the ECS service {logical_id} names its task definition other than by a Ref")
        name = str(properties.get("ServiceName", logical_id))
        found[name] = TaskDefinition.from_deployment(deployment, definition["Ref"])
    return dict(sorted(found.items(), key=lambda item: (item[0] != FIRST_SERVICE_NAME, item[0])))


def _image_asset(deployment: Deployment, image: str) -> tuple[Path, str]:
    """The staged build context and Dockerfile of the image asset that a container's Image refers to."""
    assets_file = next(deployment.assembly.directory.glob(f"{deployment.stack_name}.assets.json"), None)
    if assets_file is None:
        raise TemplateError(f"no asset manifest for {deployment.stack_name} in {deployment.assembly.directory}")
    for digest, asset in json.loads(assets_file.read_text()).get("dockerImages", {}).items():
        if digest in image:
            source = asset["source"]
            return deployment.assembly.directory / source["directory"], source.get("dockerFile", "Dockerfile")
    raise TemplateError(f"the container image {image!r} is not an image asset of this assembly")


class WorkerFleet:
    """Worker processes from the task definition, each in a slot that the supervisor keeps filled."""

    def __init__(
        self,
        task: TaskDefinition,
        *,
        environment: dict[str, str],
        volumes_dir: Path,
        unset: tuple[str, ...] = (),
        log: IO[bytes] | int | None = None,
        python: str = sys.executable,
        secretsmanager: Any | None = None,
    ) -> None:
        """``secretsmanager``: the client the task definition's ``Secrets`` are read with when a worker starts (a
        task definition with secrets and no client is refused)."""
        if task.secrets and secretsmanager is None:
            raise TemplateError(f"the task definition has secrets ({sorted(task.secrets)}) and no Secrets Manager")
        self.task = task
        self._secretsmanager = secretsmanager
        self._unset = unset
        self.python = python
        self._log = log
        self._volumes_dir = volumes_dir
        self._environment = environment
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._monitor = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
        self.replacements = 0

    # --- what a container gets --------------------------------------------------------------------------------------

    def container_path(self, path: str) -> str:
        """A container path as a local path: the image's WORKDIR is the staged build context, a mounted volume
        is a directory of ``volumes_dir``."""
        workdir = self.task.image.workdir.rstrip("/")
        if workdir and (path == workdir or path.startswith(workdir + "/")):
            return str(self.task.image.directory) + path[len(workdir) :]
        for mount, volume in self.task.mounts.items():
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                local = self._volumes_dir / volume
                local.mkdir(parents=True, exist_ok=True)
                return str(local) + path[len(mount.rstrip("/")) :]
        return path

    def environment(self, extra: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
        """A worker's environment, its secrets read now (as ECS reads them when it starts a task)."""
        image_env = {k: self._map_paths(v) for k, v in self.task.image.environment.items()}
        secrets = self.task.resolved_secrets(self._secretsmanager) if self.task.secrets else {}
        env = {
            **CONTAINER_BASE_ENV,
            **image_env,
            **self.task.environment,
            **secrets,
            **ECS_PROVIDED,
            **self._environment,
            **(extra or {}),
        }
        return {k: v for k, v in env.items() if k not in self._unset and k not in unset}

    def _map_paths(self, value: str) -> str:
        return ":".join(self.container_path(part) if part.startswith("/") else part for part in value.split(":"))

    def command(self, python: str | None = None) -> list[str]:
        command = self.task.command or self.task.image.entrypoint
        return [(python or self.python) if word in ("python", "python3") else word for word in command]

    # --- the fleet --------------------------------------------------------------------------------------------------

    def start(self, count: int) -> WorkerFleet:
        for _ in range(count):
            self.add()
        self._monitor.start()
        return self

    def add(
        self,
        *,
        supervised: bool = True,
        log: IO[bytes] | int | None = None,
        unset: tuple[str, ...] = (),
        python: str | None = None,
        **extra_env: str,
    ) -> subprocess.Popen[bytes]:
        """Start one more worker; a supervised one is replaced when it exits, an unsupervised one (for tests that
        decide when a worker runs) is not. ``log``: where its output goes (default: the fleet's); ``unset``:
        variables to leave out of its environment; ``python``: the interpreter standing in for the image's (default:
        this one)."""
        slot = _Slot(self, supervised=supervised, extra_env=extra_env, log=log, unset=unset, python=python)
        with self._lock:
            self._slots.append(slot)
        return slot.process

    def remove(self, process: subprocess.Popen[bytes]) -> None:
        """Stop a worker and drop its slot (a scale-in), waiting for its drain."""
        with self._lock:
            slot = next((s for s in self._slots if s.process is process), None)
            if slot is not None:
                self._slots.remove(slot)
        if slot is not None:
            slot.stop()

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        with self._lock:
            return [slot.process for slot in self._slots]

    def _supervise(self) -> None:
        while not self._stopping.wait(0.5):
            with self._lock:
                slots = list(self._slots)
            for slot in slots:
                if self._stopping.is_set():
                    return
                slot.check()

    def stop(self, grace_s: float | None = None) -> None:
        """The supervisor first (so that nothing is replaced), then every worker: SIGTERM, its drain, SIGKILL after the
        container's stop timeout, or after ``grace_s``."""
        self._stopping.set()
        if self._monitor.is_alive():
            self._monitor.join()
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            slot.terminate()
        deadline = None if grace_s is None else time.monotonic() + grace_s
        for slot in slots:
            slot.wait_stopped(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._slots = [slot for slot in self._slots if slot not in slots]

    def kill(self) -> None:
        """SIGKILL every worker now, without a drain (their messages come back after the visibility timeout). Takes
        no lock: a signal handler calls it while ``stop`` waits."""
        self._stopping.set()
        for slot in list(self._slots):
            slot.kill()


class _Slot:
    """One task of the service: its current process, replaced when it exits or fails its health check."""

    def __init__(
        self,
        fleet: WorkerFleet,
        *,
        supervised: bool,
        extra_env: dict[str, str],
        log: IO[bytes] | int | None,
        unset: tuple[str, ...] = (),
        python: str | None = None,
    ) -> None:
        self._fleet = fleet
        self._unset = unset
        self._python = python or fleet.python
        self.supervised = supervised
        self._extra_env = extra_env
        self._log = log if log is not None else fleet._log
        self.process = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        fleet = self._fleet
        # Read once per start: the health check runs in the same environment, as in the container.
        env = self._env = fleet.environment(self._extra_env, self._unset)
        # A container's /tmp is its own, and a replacement's starts empty: the health file the worker keeps fresh
        # (WORKER_HEALTH_FILE, /tmp/gpu-worker-health unless the task sets it) goes to a directory of this start's
        # own. In the host's /tmp, every local worker touched one file, and a frozen worker passed its checks on
        # another's heartbeat (another task's, or another stack's on the same host).
        if ENV_HEALTH_FILE not in env:
            fleet._volumes_dir.mkdir(parents=True, exist_ok=True)
            container_tmp = Path(tempfile.mkdtemp(prefix="container-tmp-", dir=fleet._volumes_dir))
            env[ENV_HEALTH_FILE] = str(container_tmp / Path(DEFAULT_HEALTH_FILE).name)
        self._started = time.monotonic()
        self._health_failures = 0
        self._kill_at: float | None = None
        self._next_check = self._started + float((fleet.task.health_check or {}).get("StartPeriod", 0))
        # A process group of its own: a terminal's Ctrl-C (SIGINT to its foreground group) reaches only the local
        # runtime, which stops the supervisor before its workers, as ECS stops a service's tasks, not the reverse.
        return subprocess.Popen(
            fleet.command(self._python),
            env=env,
            cwd=fleet.container_path(fleet.task.image.workdir),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )

    def check(self) -> None:
        if not self.supervised:
            return
        code = self.process.poll()
        if code is None and self._kill_at is not None:
            if time.monotonic() >= self._kill_at:  # it did not stop within the container's stop timeout
                self.kill()
            return
        if code is not None:
            logger.warning(
                "worker %d exited with code %s; replacing it, as ECS replaces a stopped task", self.process.pid, code
            )
            if self._fleet._stopping.wait(REPLACE_DELAY_S):
                return  # the service is being stopped: nothing is replaced any more
            self.process = self._spawn()
            self._fleet.replacements += 1  # counted once the replacement is in place, so a reader sees both
            return
        spec = self._fleet.task.health_check
        if spec and time.monotonic() >= self._next_check:
            self._next_check = time.monotonic() + float(spec.get("Interval", 30))
            if self._healthy(spec):
                self._health_failures = 0
                return
            self._health_failures += 1
            if self._health_failures >= int(spec.get("Retries", 3)):
                logger.warning(
                    "worker %d failed its health check %d times; stopping and replacing it",
                    self.process.pid,
                    self._health_failures,
                )
                self.terminate()
                self._kill_at = time.monotonic() + self._fleet.task.stop_timeout_s

    def _healthy(self, spec: dict[str, Any]) -> bool:
        command = list(spec["Command"])
        kind, words = command[0], command[1:]
        if kind == "CMD-SHELL":
            words = ["/bin/sh", "-c", " ".join(words)]
        fleet = self._fleet
        words = [self._python if word in ("python", "python3") else word for word in words]
        try:
            done = subprocess.run(
                words,
                env=self._env,
                capture_output=True,
                cwd=fleet.container_path(fleet.task.image.workdir),
                timeout=float(spec.get("Timeout", 5)),
                process_group=0,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()

    def wait_stopped(self, timeout_s: float | None = None) -> None:
        """Wait for the worker's exit, the container's stop timeout unless ``timeout_s``, then SIGKILL it."""
        try:
            self.process.wait(timeout=self._fleet.task.stop_timeout_s if timeout_s is None else timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL the worker's process group, as stopping a container kills every process in it (an engine's own
        processes included)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.supervised = False
        self.terminate()
        self.wait_stopped()
