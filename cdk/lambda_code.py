"""The code every Lambda function of the service runs: one source asset and one dependency layer, built without Docker.

The handlers (``lambdas/``), the core package (``async_inference/``) and the client package whose wire models the core
imports (``async_inference_client/``) are copied into a source asset; the dependencies pinned with their hashes in
``lambdas/requirements.lock`` (compiled from ``lambdas/requirements.txt``) are installed by pip *for the Lambda
platform*, ``--require-hashes``, into a layer. pydantic_core is compiled, so pip must fetch manylinux x86_64 wheels for
the runtime's CPython (``RUNTIME``) whatever machine runs the synth; that is what the platform flags below do. The layer
is cached under ``cdk.out/`` by the hash of the requirements file, so repeated synths (and the test session) do not
re-run pip.

The layer's asset hash must depend on what is installed, never on where: pip writes console scripts into ``bin/``
with the installing interpreter's absolute path in their shebang, and their hashes into ``*.dist-info/RECORD``. The
scripts are removed (nothing in Lambda runs them) and so are their RECORD lines, so a synth from another machine or
checkout gives the same layer, and ``cdk deploy`` publishes no new layer version and updates no function.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk.nag import acknowledge

# python3.12 runs on Amazon Linux 2023 (python3.11's Amazon Linux 2 reaches its end of life in June 2026). The layer is
# built for the same CPython: pydantic_core is compiled per Python version.
PYTHON_VERSION = "3.12"
RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.X86_64
_PIP_PLATFORM = ["--platform", "manylinux2014_x86_64", "--implementation", "cp", "--python-version", PYTHON_VERSION]
# The Lambda runtime ships boto3/botocore. A botocore pulled in by aws-xray-sdk would sit before the runtime's on
# sys.path (layers come first) and pair an arbitrary botocore with the runtime's boto3, so it is removed from the layer.
_PROVIDED_BY_RUNTIME = ("boto3", "botocore", "s3transfer")
# .sh: the streaming API function's start command, which Lambda Web Adapter executes (its mode is kept: executable).
_SOURCE_SUFFIXES = {".py", ".json", ".txt", ".sh"}


def _install_dependencies(requirements: Path, cache_root: Path) -> Path:
    """A layer directory (``python/...``) with the requirements installed for Lambda; built once per requirements."""
    digest = hashlib.sha256(requirements.read_bytes() + " ".join(_PIP_PLATFORM).encode()).hexdigest()[:16]
    layer_dir = cache_root / f"deps-{digest}"
    if (layer_dir / ".complete").exists():
        return layer_dir
    # Built in a directory of its own and moved into place whole: two synths at once (test workers on a fresh clone)
    # each build one, the first rename wins and the other's copy is dropped.
    cache_root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"deps-{digest}.", suffix=".building", dir=cache_root))
    target = building / "python"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    command += [*_PIP_PLATFORM, "--only-binary=:all:", "--require-hashes", "--target", str(target)]
    command += ["-r", str(requirements)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip could not install {requirements} for the Lambda platform:\n{result.stderr}")
    for entry in target.iterdir():
        name = entry.name.split("-")[0].lower()
        if name in _PROVIDED_BY_RUNTIME or entry.name == "bin":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for record in target.glob("*.dist-info/RECORD"):
        _drop_outside_entries(record)
    (building / ".complete").write_text(digest)
    building.chmod(0o755)  # mkdtemp's directory is private; the asset is the directory's contents, as before
    try:
        building.rename(layer_dir)
    except OSError:  # another synth built the same layer first
        shutil.rmtree(building, ignore_errors=True)
    return layer_dir


def _drop_outside_entries(record: Path) -> None:
    """Remove a RECORD's lines for files outside the install target (``../../bin/<script>``, deleted above): their
    hashes cover shebangs holding the building interpreter's path, which would make the layer's hash depend on it."""
    lines = record.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("../")]
    if len(kept) != len(lines):
        record.write_text("".join(kept))


def _stage_sources(project_root: Path, packages: Sequence[str], cache_root: Path) -> Path:
    """A directory holding only the service's own packages, so the asset hash changes only when they do.

    It is named by its content and moved into place whole, never rewritten: a synth running beside this one (a test's
    variant, ``make synth``) copies from a directory no other synth deletes under it."""
    files = [
        path
        for package in packages
        for path in sorted((project_root / package).rglob("*"))
        if path.is_file() and path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts
    ]
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(project_root)}\0{path.stat().st_mode & 0o111}\0".encode())
        digest.update(path.read_bytes())
    staged = cache_root / f"sources-{digest.hexdigest()[:16]}"
    if staged.is_dir():
        os.utime(staged)  # used now: not pruned as stale
        return staged
    cache_root.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="sources-", suffix=".building", dir=cache_root))
    for path in files:
        destination = building / path.relative_to(project_root)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
        shutil.copymode(path, destination)
    building.chmod(0o755)  # mkdtemp's directory is private
    try:
        building.rename(staged)
    except OSError:  # another synth staged the same sources first
        shutil.rmtree(building, ignore_errors=True)
    _prune_stale_sources(cache_root, keep=staged)
    return staged


def _prune_stale_sources(cache_root: Path, keep: Path) -> None:
    """Remove staged sources of other code that no synth has used for a day (a synth in flight uses its own now)."""
    stale_before = time.time() - 86_400
    for entry in cache_root.glob("sources*"):
        if entry != keep and entry.is_dir() and entry.stat().st_mtime < stale_before:
            shutil.rmtree(entry, ignore_errors=True)


class LambdaCode(Construct):
    """The shared source asset and dependency layer, and a factory for functions that run them.

    :param project_root: repository root holding the packages and the requirements file.
    :param packages: top-level packages copied into the source asset. Default:
        ``("async_inference", "async_inference_client", "lambdas")``.
    :param requirements: the pinned, hashed requirements installed into the layer. Default:
        ``<project_root>/lambdas/requirements.lock``.
    :param cache_dir: where built layers are kept between synths. Default: ``<project_root>/cdk.out/.lambda-build``.
    :param log_retention: retention of each function's log group. Default: one month.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        project_root: Path,
        packages: Sequence[str] = ("async_inference", "async_inference_client", "lambdas"),
        requirements: Path | None = None,
        cache_dir: Path | None = None,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        cache_root = cache_dir or project_root / "cdk.out" / ".lambda-build"
        cache_root.mkdir(parents=True, exist_ok=True)
        layer_dir = _install_dependencies(requirements or project_root / "lambdas" / "requirements.lock", cache_root)
        self.log_retention = log_retention
        self.layer = lambda_.LayerVersion(
            self,
            "Dependencies",
            code=lambda_.Code.from_asset(str(layer_dir), exclude=[".complete"]),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="pydantic, Powertools and standardwebhooks for the inference service's functions",
        )
        self._sources = str(_stage_sources(project_root, packages, cache_root))
        self.code = lambda_.Code.from_asset(self._sources)
        self._nested_code: dict[str, lambda_.Code] = {}

    def code_for(self, scope: Construct) -> lambda_.Code:
        """The source asset for a function in ``scope``'s stack: ``code`` in this construct's own stack, else one of
        that stack's (CDK binds an asset to one stack; the same sources make the same asset, uploaded once)."""
        stack = Stack.of(scope)
        if stack is Stack.of(self):
            return self.code
        key = stack.node.path
        if key not in self._nested_code:
            self._nested_code[key] = lambda_.Code.from_asset(self._sources)
        return self._nested_code[key]

    def new_function(
        self,
        scope: Construct,
        id: str,
        *,
        handler: str,
        description: str,
        service_name: str,
        environment: Mapping[str, str],
        timeout: Duration = Duration.seconds(30),
        memory_size: int = 512,
        role: iam.IRole | None = None,
    ) -> lambda_.Function:
        """A function of ``RUNTIME`` on the shared code and layer, traced with X-Ray, with its own log group; ``role``:
        another function's (the two share every grant), else its own."""
        log_group = logs.LogGroup(
            scope, f"{id}Logs", retention=self.log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        function = lambda_.Function(
            scope,
            id,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=handler,
            code=self.code_for(scope),
            layers=[self.layer],
            description=description,
            environment={"POWERTOOLS_SERVICE_NAME": service_name, **environment},
            timeout=timeout,
            memory_size=memory_size,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=log_group,
            role=role,
        )
        acknowledge(
            function,
            {
                "AwsSolutions-L1": f"{RUNTIME.name} on purpose: on Amazon Linux 2023 and supported until 2028; the "
                "layer is built for the same CPython (pydantic_core is compiled per Python version), so the runtime "
                "and PYTHON_VERSION change together.",
                "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AWSLambdaBasicExecutionRole]": "The standard Lambda logging policy: CloudWatch Logs writes only.",
                "AwsSolutions-IAM5[Resource::*]": "X-Ray tracing: xray:PutTraceSegments and PutTelemetryRecords "
                "support no resource-level permissions.",
            },
        )
        return function
