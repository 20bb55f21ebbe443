"""The worker image builds on a PEP 668 base (issue 21, defect 11): recent vLLM images are Ubuntu 24.04-based, whose
system Python refuses a plain ``pip install`` ("externally-managed-environment")."""

from __future__ import annotations

import re
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "gpu_worker" / "Dockerfile"
# An install that a PEP 668 system Python accepts: uv's --system (what vLLM's docs use to extend its image), or the
# pip of a virtualenv made in the image.
ALLOWED = (
    re.compile(r"\buv pip install --system\b"),
    re.compile(r"/(venv|\.venv)/bin/(pip|python3? -m pip) install\b"),
)


def _run_instructions(text: str) -> list[str]:
    """Each RUN instruction, its continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    return [line.strip()[4:] for line in joined.splitlines() if line.strip().startswith("RUN ")]


def test_the_dockerfile_installs_nothing_into_the_system_python_unguarded():
    # GIVEN the worker's Dockerfile WHEN reading each RUN that installs Python packages
    installs = [
        command
        for run in _run_instructions(DOCKERFILE.read_text())
        for command in re.split(r"&&|;", run)
        if re.search(r"\bpip3? install\b|-m pip install\b", command)
    ]
    assert installs, "the Dockerfile installs the worker's requirements"
    # THEN each goes through uv --system or a virtualenv, never a bare pip into the system Python (nor around the
    # marker with --break-system-packages)
    unguarded = [c for c in installs if not any(p.search(c) for p in ALLOWED) or "--break-system-packages" in c]
    assert unguarded == []
