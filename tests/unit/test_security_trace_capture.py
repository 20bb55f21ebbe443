"""Every traced function in lambdas/ leaves its return value out of X-Ray: Powertools records it by default
(``capture_response=True``), and the authorizer's answer holds the caller's API key, the API's presigned URLs."""

from __future__ import annotations

import ast
from pathlib import Path

LAMBDAS = Path(__file__).resolve().parents[2] / "lambdas"
CAPTURES = {"capture_lambda_handler", "capture_method"}


def tracer_decorators(path: Path) -> list[ast.expr]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr in CAPTURES:
                    found.append(decorator)
    return found


def captures_response(decorator: ast.expr) -> bool:
    if not isinstance(decorator, ast.Call):
        return True  # the bare decorator: Powertools' default, on
    for keyword in decorator.keywords:
        if keyword.arg == "capture_response":
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value is False)
    return True


def test_no_traced_function_in_lambdas_records_its_response():
    # GIVEN every handler module under lambdas/
    modules = sorted(LAMBDAS.rglob("*.py"))
    # WHEN their tracer decorators are read
    decorated = {path: tracer_decorators(path) for path in modules}
    # THEN there are some (the authorizer's among them), and none leaves response capture on
    assert decorated[LAMBDAS / "authorizer" / "handler.py"]
    capturing = [
        f"{path.relative_to(LAMBDAS)}:{d.lineno}" for path, ds in decorated.items() for d in ds if captures_response(d)
    ]
    assert capturing == [], f"tracer decorators recording their return value (secrets reach X-Ray): {capturing}"
