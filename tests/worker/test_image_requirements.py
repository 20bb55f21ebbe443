"""The worker image's Python dependencies are gpu_worker/requirements.lock (requirements.txt pinned with hashes) and
nothing else (vLLM's image brings vLLM and torch, not what the worker imports). A worker started from a fresh venv
made of that file alone (``--require-hashes``, as the Dockerfile installs it), over a copy of exactly what the
Dockerfile copies, must run a job: an import the image lacks fails here, not at the first deployment.

The venv is cached under ``.venv-image-<hash>/`` (git-ignored), keyed by the requirements file and the Python version,
so repeated runs take seconds; a clean checkout (CI) builds it from scratch.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from async_inference_client import Client
from tests.faults.fault_stack import FaultStack, chat

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "gpu_worker" / "Dockerfile"
REQUIREMENTS = REPO_ROOT / "gpu_worker" / "requirements.lock"  # what the Dockerfile installs, hashes required
IMAGE_WORKDIR = "/app"


def image_venv() -> Path:
    """A venv holding only gpu_worker/requirements.txt, built once per version of that file."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:16]
    venv = REPO_ROOT / f".venv-image-{key}"
    if (venv / ".complete").is_file():
        return venv
    # Built beside its final place and renamed into it, so an interrupted build is never taken for a complete one.
    building = REPO_ROOT / f".venv-image-{key}.{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
    subprocess.run(
        [str(building / "bin" / "python"), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(REQUIREMENTS)],
        check=True,
        timeout=900,
    )
    (building / ".complete").touch()
    try:
        building.rename(venv)
    except OSError:  # another run finished first: use its venv
        shutil.rmtree(building, ignore_errors=True)
    return venv


def image_copies() -> list[tuple[str, str]]:
    """(source in the repo, destination under /app) for every COPY in the Dockerfile."""
    copies = []
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"^COPY\s+(\S+)\s+(\S+)\s*$", line.strip())
        if match:
            source, destination = match.groups()
            assert destination.startswith(IMAGE_WORKDIR + "/"), f"COPY outside {IMAGE_WORKDIR}: {line}"
            copies.append((source, destination.removeprefix(IMAGE_WORKDIR + "/")))
    return copies


def test_the_dockerfile_copies_the_worker_packages():
    # The test below runs what these lines copy; if the image stopped copying them it would test nothing.
    assert {destination for _, destination in image_copies()} >= {
        "async_inference/",
        "async_inference_client/",
        "gpu_worker/",
    }


def test_a_worker_from_the_image_requirements_alone_runs_a_job(stack: FaultStack, api: Client, tmp_path: Path):
    # GIVEN a venv with gpu_worker/requirements.txt only, standing in for the image's Python
    venv = image_venv()
    log = tmp_path / "worker.log"
    # WHEN a worker starts as the task definition says (its environment, the image's ENV and ENTRYPOINT, the image's
    # staged build context as /app) with that Python, against the local stack
    with open(log, "wb") as out:
        worker = stack.local.start_worker(
            python=str(venv / "bin" / "python"), log=out, ENGINE="echo", RECEIVE_WAIT_S="1"
        )
    try:
        job_id = api.submit(chat("from the image requirements", max_tokens=4)).job_id
        deadline = time.monotonic() + 60
        job = api.get(job_id)
        while job.status not in ("succeeded", "failed") and time.monotonic() < deadline:
            assert worker.poll() is None, f"the worker exited with {worker.returncode}:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
            job = api.get(job_id)
        # THEN it ran the job, with nothing but that venv and the image's files to import from
        assert job.status == "succeeded", (job, log.read_text()[-3000:])
        assert api.result(job).choices[0].message.content == "from the image requirements"
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert worker.returncode == 0, log.read_text()[-3000:]


def test_the_staged_build_context_holds_what_the_dockerfile_copies(stack: FaultStack):
    # The worker above runs from the image's build context as the synth staged it; the image gets what COPY takes.
    assert stack.local.fleet is not None
    context = stack.local.fleet.task.image.directory
    for source, _ in image_copies():
        assert (context / source).exists(), f"{source} is copied by the Dockerfile but not in the build context"
