"""Small cloud assemblies written by hand, for tests of the local runtime's parts on one resource at a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_assembly(
    directory: Path,
    resources: dict[str, Any],
    assets: dict[str, dict[str, str]] | None = None,
    outputs: dict[str, Any] | None = None,
) -> Path:
    """An assembly of one stack ``S`` with ``resources``; ``assets`` maps an asset directory name to its files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(
        json.dumps(
            {
                "artifacts": {
                    "S": {"type": "aws:cloudformation:stack", "properties": {"templateFile": "S.template.json"}}
                }
            }
        )
    )
    (directory / "S.template.json").write_text(json.dumps({"Resources": resources, "Outputs": outputs or {}}))
    for asset, files in (assets or {}).items():
        for name, text in files.items():
            path = directory / asset / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return directory


def python_function(
    asset: str, handler: str, *, environment: dict[str, Any] | None = None, timeout: int = 3
) -> dict[str, Any]:
    """An AWS::Lambda::Function resource on a code asset, as CDK writes one."""
    return {
        "Type": "AWS::Lambda::Function",
        "Properties": {
            "Runtime": "python3.11",
            "Handler": handler,
            "Code": {"S3Bucket": "assets", "S3Key": f"{asset}.zip"},
            "Timeout": timeout,
            "MemorySize": 256,
            "Environment": {"Variables": environment or {}},
        },
        "Metadata": {"aws:asset:path": asset, "aws:asset:property": "Code"},
    }
