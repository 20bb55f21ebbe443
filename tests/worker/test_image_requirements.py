"""The worker image's Python dependencies are gpu_worker/requirements.lock (requirements.txt pinned with hashes) and
nothing else (vLLM's image brings vLLM and torch, not what the worker imports). A worker started from a fresh venv
made of that file alone (``--require-hashes``, as the Dockerfile installs it), over the build context as BuildKit would
send it from the asset the synth staged (``cdk.worker_image``), must run a job: an import the image lacks fails here,
not at the first deployment. ``make image-check`` does the same over the pinned vLLM on the real engine.

The venv is cached under ``.venv-image-<hash>/`` (git-ignored), keyed by the requirements file and the Python version,
so repeated runs take seconds; a clean checkout (CI) builds it from scratch.
"""

from __future__ import annotations

import dataclasses
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
from cdk.worker_image import WORKER_DOCKERFILE, assemble, context_files, copy_sources, missing_copy_sources
from local_runtime.workers import WorkerFleet
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
    # GIVEN a venv with gpu_worker/requirements.txt only, standing in for the image's Python, and the files BuildKit
    # would send from the staged asset (not the asset itself: the build filters it again with the ignore file)
    venv = image_venv()
    assert stack.local.fleet is not None
    task = stack.local.fleet.task
    context = tmp_path / "context"
    assemble(context, task.image.directory, WORKER_DOCKERFILE)
    log = tmp_path / "worker.log"
    # WHEN a worker starts as the task definition says (its environment, the image's ENV and ENTRYPOINT, that
    # context as /app) with that Python, against the local stack
    fleet = WorkerFleet(
        dataclasses.replace(task, image=dataclasses.replace(task.image, directory=context)),
        environment=stack.local._worker_overrides("echo"),
        volumes_dir=tmp_path / "volumes",
        unset=("MODEL", "MODEL_S3_URI"),
    )
    with open(log, "wb") as out:
        worker = fleet.add(supervised=False, python=str(venv / "bin" / "python"), log=out, RECEIVE_WAIT_S="1")
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


def test_the_staged_asset_sends_the_build_what_the_dockerfile_copies(stack: FaultStack):
    # GIVEN the asset the synth staged (cdk.out/asset.*, what `cdk deploy` hands to `docker build`)
    assert stack.local.fleet is not None
    staged = stack.local.fleet.task.image.directory
    # WHEN BuildKit filters it with the ignore file beside the Dockerfile THEN every COPY source is still there
    files = context_files(staged, WORKER_DOCKERFILE)
    assert missing_copy_sources(files, copy_sources((staged / WORKER_DOCKERFILE).read_text())) == []
    # AND it is the context the repository itself gives: the asset's exclude and the ignore file agree
    assert files == context_files()
