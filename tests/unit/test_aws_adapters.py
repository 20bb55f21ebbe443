"""boto3 is called from the adapter modules only, as the package ``async_inference/aws/`` says: the rest of the service
reaches AWS through them, so it can be imported, and tested, without an AWS SDK in the way."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("async_inference", "async_inference_client", "gpu_worker", "lambdas")
# The adapter package (every module of it), and the adapters outside it that its docstring names (batches/aws.py
# calls boto3 through aws.client()).
ADAPTER_PACKAGE = "async_inference/aws/"
ADAPTERS = {
    "async_inference/batches/aws.py",
    "async_inference/batches/store.py",
    "gpu_worker/model_source.py",
    "async_inference/preflight.py",
}


def boto3_importers() -> set[str]:
    found = set()
    for package in PRODUCT_PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            names = [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
            names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
            if any(name.split(".")[0] == "boto3" for name in names):
                found.add(path.relative_to(REPO_ROOT).as_posix())
    return found


def test_only_the_adapter_modules_import_boto3():
    importers = boto3_importers()
    assert "async_inference/aws/clients.py" in importers, "the scan found the adapters"
    assert {path for path in importers if not path.startswith(ADAPTER_PACKAGE)} - ADAPTERS == set()


def test_the_aws_module_names_every_adapter_that_calls_boto3():
    import async_inference.aws

    doc = async_inference.aws.__doc__ or ""
    assert all(path.removeprefix("async_inference/") in doc or path in doc for path in ADAPTERS), doc
