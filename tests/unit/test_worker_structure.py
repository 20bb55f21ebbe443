"""The worker's shape (issue #18): no class of the pump, the receiving side or the runner over about 300 lines, and no
import circle between the worker's modules."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The modules that Worker was split into; a class that grows past this is taking on a second concern.
MODULES = ("gpu_worker/worker.py", "gpu_worker/receiving.py", "gpu_worker/runner.py")
MAX_CLASS_LINES = 310


def class_sizes(path: Path) -> dict[str, int]:
    """Lines of each class in ``path``, from its ``class`` line to its last, as ``ast`` reports them."""
    tree = ast.parse(path.read_text())
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
    }


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_worker_modules(path: Path, modules: set[str]) -> set[str]:
    """The ``gpu_worker`` modules that ``path`` imports anywhere in it (``from gpu_worker import x`` names module x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names & modules


def test_no_class_of_the_worker_is_over_about_300_lines():
    # GIVEN the modules the worker was split into (the pump, its receiving side, the claim runner)
    sizes = {f"{name}:{cls}": lines for name in MODULES for cls, lines in class_sizes(ROOT / name).items()}
    assert any(key.endswith(":Worker") for key in sizes)  # the pump is still where the split put it
    # WHEN their classes are measured THEN none is over the limit
    assert {key: lines for key, lines in sizes.items() if lines > MAX_CLASS_LINES} == {}


def test_the_worker_modules_import_no_circle():
    # GIVEN every module of gpu_worker and the gpu_worker modules each imports (at the top or inside a function)
    paths = {module_name(path): path for path in (ROOT / "gpu_worker").rglob("*.py")}
    graph = {name: imported_worker_modules(path, set(paths)) - {name} for name, path in paths.items()}
    assert "gpu_worker.receiving" in graph["gpu_worker.worker"]
    # WHEN they are put in import order THEN there is one: no module imports itself through others
    graphlib.TopologicalSorter(graph).prepare()
