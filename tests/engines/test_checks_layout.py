"""The development checks live in checks/, apart from the worker image (issue 18): the worker's package imports
neither them nor the local stack, and the checks import the repository as a package, without editing sys.path."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_worker_package_imports_neither_the_local_stack_nor_the_checks():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m.split(".")[0] in ("local_runtime", "checks")
        )
        for path in (ROOT / "gpu_worker").rglob("*.py")
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_the_checks_do_not_edit_sys_path_and_ship_nowhere():
    for path in (ROOT / "checks").glob("*.py"):
        assert "sys.path" not in path.read_text(), path
    # the worker image copies async_inference/ and gpu_worker/ only
    dockerignore = (ROOT / "gpu_worker" / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!checks/" not in dockerignore and not list((ROOT / "gpu_worker").glob("*check*"))
