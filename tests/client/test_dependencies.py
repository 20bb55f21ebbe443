"""The client package stands alone: its dependencies are declared once for `pip install .` (pyproject.toml) and
repeated for `make venv` (requirements.txt), the two agree; and nothing of it reaches into the service, so importing
it pulls in neither boto3, pydantic-settings nor any module of the service."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENT = REPO_ROOT / "async_inference_client"
# The top-level packages of the service, and what only the service may use.
SERVICE_ONLY = (
    "async_inference",
    "lambdas",
    "gpu_worker",
    "cdk",
    "local_runtime",
    "boto3",
    "botocore",
    "pydantic_settings",
    "aws_lambda_powertools",
)


def test_every_client_dependency_is_in_requirements_txt_with_the_same_bounds():
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    required = {line.split("#")[0].strip() for line in (REPO_ROOT / "requirements.txt").read_text().splitlines()}
    assert [d for d in declared if d not in required] == []


def test_no_client_module_imports_the_service():
    # GIVEN every module of the client package, read as source
    imported = {}
    for path in sorted(CLIENT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        names += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        imported[path.relative_to(REPO_ROOT).as_posix()] = names
    # THEN none of them names a package of the service (lazily inside a function included)
    reaching = {path: [n for n in names if n.split(".")[0] in SERVICE_ONLY] for path, names in imported.items()}
    assert {path: names for path, names in reaching.items() if names} == {}
    assert "async_inference_client/client.py" in imported, "the scan read the package"


def test_importing_the_client_loads_nothing_of_the_service():
    # GIVEN the project's own venv, where boto3 and the service are importable
    # WHEN the SDK and the CLI are imported
    script = (
        "import sys, async_inference_client, async_inference_client.cli\n"
        f"print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in {SERVICE_ONLY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    # THEN none of it was loaded
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_the_service_takes_its_wire_objects_from_the_client():
    # The API answers with the very models the SDK parses: one definition, imported by the service.
    from async_inference import schemas
    from async_inference.batches import models as batch_models
    from async_inference_client.models import batches, chat, jobs

    assert schemas.JobView is jobs.JobView and schemas.ChatCompletion is chat.ChatCompletion
    assert batch_models.Batch is batches.Batch and batch_models.FileObject is batches.FileObject


def test_no_class_of_the_service_takes_the_name_of_a_client_model_or_error():
    # GIVEN the names of the client's wire models and errors
    from async_inference_client import errors
    from async_inference_client.models import batches, chat, jobs

    client_names = {
        name
        for module in (errors, batches, chat, jobs)
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
    }
    assert {"ApiError", "JobView", "Batch"} <= client_names
    # WHEN every class the service defines is listed
    service = {}
    for path in sorted((REPO_ROOT / "async_inference").rglob("*.py")) + sorted((REPO_ROOT / "lambdas").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                service.setdefault(node.name, []).append(path.relative_to(REPO_ROOT).as_posix())
    # THEN none is a second definition of one of them (one model per wire object; one ApiError, the client's)
    assert {name: service[name] for name in client_names & set(service)} == {}
