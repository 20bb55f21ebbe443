"""What the worker image and the Lambda layer install is pinned, with hashes: each lock file holds every requirement
of the file it was compiled from, at a version that file allows, and every pin carries its hashes; the image and the
layer build install from the lock with ``--require-hashes``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cdk import lambda_code

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCKS = {
    REPO_ROOT / "gpu_worker" / "requirements.txt": REPO_ROOT / "gpu_worker" / "requirements.lock",
    REPO_ROOT / "lambdas" / "requirements.txt": REPO_ROOT / "lambdas" / "requirements.lock",
}
# How to compile them again after a change to a requirements file (the command uv writes at the top of each lock).
UV_COMMAND = re.compile(r"^#\s+uv pip compile (\S+) --generate-hashes .* -o (\S+)$", re.M)


def pins(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of each pin in a lock file."""
    found: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", lock.read_text()):
        match = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", block)
        if match:
            found[canonicalize_name(match[1])] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return found


@pytest.mark.parametrize("requirements", list(LOCKS), ids=lambda path: path.parent.name)
def test_the_lock_pins_every_requirement_within_its_bounds_with_hashes(requirements: Path):
    lock = LOCKS[requirements]
    pinned = pins(lock)
    assert pinned, f"{lock} pins nothing"
    # Every pin carries at least one hash (pip --require-hashes refuses the file otherwise).
    assert {name for name, (_, hashes) in pinned.items() if not hashes} == set()
    # Every requirement is pinned, at a version its specifier allows: a requirements change without a new lock fails.
    for line in requirements.read_text().splitlines():
        if line.split("#")[0].strip():
            requirement = Requirement(line.split("#")[0].strip())
            name = canonicalize_name(requirement.name)
            assert name in pinned, f"{name} is not in {lock.name}: compile it again"
            assert requirement.specifier.contains(pinned[name][0], prereleases=True), (name, pinned[name][0])
    # And the lock says how it was made, from which file, into which file.
    command = UV_COMMAND.search(lock.read_text())
    assert command and (command[1], command[2]) == (
        requirements.relative_to(REPO_ROOT).as_posix(),
        lock.relative_to(REPO_ROOT).as_posix(),
    )


def test_the_image_installs_the_worker_lock_with_hashes_required():
    dockerfile = (REPO_ROOT / "gpu_worker" / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if line.startswith("RUN") and "pip install" in line]
    # (uv's --system: the image's Python is PEP 668 managed, tests/worker/test_dockerfile.py)
    assert installs == ["RUN uv pip install --system --no-cache --require-hashes -r /app/gpu_worker/requirements.lock"]
    assert "COPY gpu_worker/requirements.lock /app/gpu_worker/requirements.lock" in dockerfile


def test_the_layer_is_built_from_the_lambda_lock_with_hashes_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # GIVEN the layer build, with pip replaced by a recorder
    commands: list[list[str]] = []

    class Done:
        returncode, stderr = 0, ""

    def record(command: list[str], **kwargs: object) -> Done:
        commands.append(command)
        (Path(command[command.index("--target") + 1])).mkdir(parents=True)
        return Done()

    monkeypatch.setattr(lambda_code.subprocess, "run", record)
    # WHEN the construct's default requirements are installed
    default = inspect.getsource(lambda_code.LambdaCode.__init__)
    assert '"lambdas" / "requirements.lock"' in default
    lambda_code._install_dependencies(REPO_ROOT / "lambdas" / "requirements.lock", tmp_path)
    # THEN pip was asked for the lock's exact files and nothing unhashed
    [command] = commands
    assert "--require-hashes" in command and command[-2:] == ["-r", str(REPO_ROOT / "lambdas" / "requirements.lock")]
