"""What deploys never imports the local runtime (issue #18): the product packages run on AWS, where ``local_runtime``
(moto, the emulated API Gateway, the CPU engine's wiring) is neither installed nor wanted; the dev checks that drive
the local stack live in ``checks/``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("async_inference", "async_inference_client", "gpu_worker", "lambdas", "cdk")


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_product_module_imports_the_local_runtime():
    # GIVEN every Python file of the packages that deploy
    files = [p for package in PRODUCT_PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50, "the product packages were not found"
    # WHEN their imports are read THEN none names local_runtime
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m.split(".")[0] == "local_runtime")
        for p in files
    }
    assert {f: m for f, m in offenders.items() if m} == {}


def test_the_check_finds_an_import_of_the_local_runtime(tmp_path: Path):
    # GIVEN a module that imports the local runtime inside a function WHEN its imports are read THEN it is found
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from local_runtime.stack import LocalDeployment\n    import local_runtime\n")
    assert {"local_runtime.stack", "local_runtime"} <= imported_modules(module)
